// The playground page in headless Chromium: fill in the example schema, compile it, run the
// composed prompt cached and uncached, read both answers and TTFTs, save a screenshot. With KEY
// (a server started with that API key): the page first asks for the key, refuses a wrong one,
// keeps the right one for the tab and never puts it in a URL.
//   node playground_e2e.js URL CHROMIUM SCREENSHOT [KEY]
// Exits non-zero with a message when something on the page is missing or wrong.
"use strict";
const { chromium } = require("playwright-core");

const [url, executablePath, screenshot, key] = process.argv.slice(2);

function fail(message) {
  console.error("FAIL: " + message);
  process.exitCode = 1;
}

(async () => {
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1100, height: 1200 } });
    const requests = [];
    page.on("request", (r) => requests.push(r.url()));
    page.on("pageerror", (e) => fail("page error: " + e.message));
    await page.goto(url);
    if (key) {
      await page.waitForSelector("#key-prompt", { state: "visible", timeout: 30000 });
      const ask = await page.textContent("#key-prompt");
      if (!/API key/.test(ask)) fail("the key prompt does not ask for the API key: " + ask);
      await page.fill("#api-key", "not-the-key");
      await page.press("#api-key", "Enter");
      await page.waitForFunction(() => /refused/.test(document.querySelector("#key-prompt").textContent),
                                 null, { timeout: 30000 });
      await page.fill("#api-key", key);
      await page.press("#api-key", "Enter");
      await page.waitForSelector("#key-prompt", { state: "hidden", timeout: 30000 });
      // Kept for the tab: a reload needs no second entry.
      await page.reload();
      await page.waitForLoadState("networkidle");
      if (await page.isVisible("#key-prompt")) fail("the key is asked for again after a reload");
      if (await page.inputValue("#api-key") !== key) fail("the key was not kept for the tab");
      // An old ?api_key= link: the key leaves the address bar and is not used.
      await page.goto(url + "?api_key=" + key);
      await page.waitForLoadState("networkidle");
      if (page.url().includes(key)) fail("the key stays in the address bar: " + page.url());
    } else {
      await page.waitForLoadState("networkidle");
      if (await page.isVisible("#key-prompt")) fail("a key is asked for by a server without one");
    }
    await page.click("#example");
    await page.click("#compile");
    // The layout table fills once the compile stream ends: the root and four modules.
    await page.waitForFunction(() => document.querySelectorAll("#layout tbody tr").length === 5,
                               null, { timeout: 60000 });
    const rows = await page.$$eval("#layout tbody tr", (trs) => trs.map((tr) =>
      Array.from(tr.querySelectorAll("td")).map((td) => td.textContent.trim())));
    console.log("layout:", JSON.stringify(rows));
    if (rows[1][1] !== "cats") fail("second layout row is not module 'cats': " + rows[1]);
    if (!/^\d+–\d+$/.test(rows[1][2])) fail("no position range in the layout: " + rows[1][2]);
    if (rows[1][4] !== "yes") fail("module 'cats' is not shown as cached");
    const status = await page.textContent("#status");
    if (!/pass \d+\/\d+/.test(status)) fail("no compile progress shown: " + status);
    // The first module is checked by default: its prompt is a prefix of the layout, so the
    // cached answer must equal the uncached one (promptcache's prefix-exact contract).
    await page.fill("#question", "What do cats do at night?");
    await page.fill("#max-tokens", "16");
    const prompt = await page.inputValue("#prompt-xml");
    if (!prompt.includes("<cats/>") || !prompt.includes("<user>What do cats do at night?</user>")) {
      fail("composed prompt is wrong: " + prompt);
    }
    await page.click("#run");
    await page.waitForFunction(() => document.querySelector("#ttft-uncached").textContent !== "",
                               null, { timeout: 60000 });
    const read = (id) => page.textContent(id);
    const cached = await read("#answer-cached"), uncached = await read("#answer-uncached");
    const ttftCached = parseFloat(await read("#ttft-cached"));
    const ttftUncached = parseFloat(await read("#ttft-uncached"));
    console.log(JSON.stringify({ cached, uncached, ttftCached, ttftUncached,
                                 status: await read("#status") }));
    if (!cached) fail("no cached answer");
    if (cached !== uncached) fail("cached and uncached answers differ for a prefix prompt");
    if (!(ttftCached > 0) || !(ttftUncached > 0)) fail("TTFTs not shown as numbers");
    const stats = await read("#stats-cached");
    if (!/\d+ cached \+ \d+ fresh/.test(stats)) fail("no token counts shown: " + stats);
    const barWidth = await page.$eval("#bar-uncached", (b) => b.style.width);
    if (!barWidth.endsWith("%")) fail("TTFT bar chart not drawn");
    const origin = new URL(url).origin;
    const foreign = requests.filter((r) => !r.startsWith(origin));
    if (foreign.length) fail("the page fetched from elsewhere: " + foreign.join(", "));
    if (key) {
      const leaked = requests.filter((r) => r.includes(key) && !r.includes("?api_key="));
      if (leaked.length) fail("the key was put in a URL: " + leaked.join(", "));
    }
    await page.screenshot({ path: screenshot, fullPage: true });
    console.log("screenshot: " + screenshot);
  } finally {
    await browser.close();
  }
})().catch((e) => fail(e.stack || String(e)));
