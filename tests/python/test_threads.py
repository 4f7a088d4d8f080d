"""One Engine used from 4 Python threads at once gives each call the result it gets alone (the
GIL is released during model work)."""
import threading

import promptcache as pc

PROMPTS = [
    '<prompt schema="stories"><instruction/><park/> Lily had a red</prompt>',
    '<prompt schema="stories"><instruction/><home/> Tim was tired, so he went to</prompt>',
    '<prompt schema="stories"><park/> The sun was</prompt>',
    '<prompt schema="stories"><instruction/><park/><home/> One day, Tim and Lily</prompt>',
]


def work(eng, i):
    p = PROMPTS[i % len(PROMPTS)]
    g = eng.generate(p, max_new_tokens=24)
    s = eng.score(p, ["ball", "sleep", "happy"])
    return g.text, g.token_ids, s.logprob_per_token, s.pred


def test_four_threads_get_the_serial_results(stories):
    serial = [work(stories, i) for i in range(16)]
    results = [None] * 16
    errors = []
    start = threading.Barrier(4)

    def thread(t):
        try:
            start.wait()
            for i in range(t, 16, 4):
                results[i] = work(stories, i)
        except BaseException as e:  # noqa: B902 - reported below
            errors.append(e)

    threads = [threading.Thread(target=thread, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, serial):
        assert got[0] == want[0] and got[1] == want[1] and got[3] == want[3]
        for a, b in zip(got[2], want[2]):
            assert all(abs(x - y) <= 1e-5 for x, y in zip(a, b))


def test_threads_overlap_in_model_work(stories):
    """While one thread is inside a long generate, another thread's Python code runs."""
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    for _ in range(3):
        stories.generate(PROMPTS[0], max_new_tokens=200)
    done.set()
    t.join()
    assert len(ticks) > 5
