// promptcache/cache/span_store.hpp — compiled spans, content-addressed, in tiers with budgets.
//
// Every stored span has a key: a hash of what its states are a function of — the model
// (fingerprint), the compute and KV dtypes, the encoding mode, and the token ids and positions of
// the span and of every span before it in the encoding pass that stores it (the scaffold, or the
// module's own spans in isolated mode: encoding_context). Two schemas holding the same module
// text at the same positions after the same preceding scaffold get the same key and share one
// stored copy (the one stored first; the compiler may batch two such passes differently, so a
// shared copy equals the other schema's own compile within float rounding).
//
// The states of a key live in tiers: the device (a copy on the model's device, when the model
// is not on the CPU), host memory (on the CPU: the tier requests read; mapped from a cache file
// or compiled), a cache file (the schema's file under --cache-dir, re-read one span at a time)
// a remote store (Redis, redis_tier.hpp: shared by every process pointed at it) and, last,
// the model itself (the span is compiled again, alone, from its encoding context).
// Device and host tiers have byte budgets (0: no limit): a request promotes the spans it uses
// into the top tier and holds them (pin) while its states are assembled, and the least recently
// used spans no request holds are evicted when a tier is over budget (from the device to the
// host, from the host to nothing). Both are one Tier (tier.hpp: budget, LRU, eviction, metrics)
// with its policy; the file and the remote store are lower tiers read the same way (promote).
// Evicting drops the store's reference only: a request whose KV cache still reads a span keeps its
// memory alive (tensors are reference counted) until it ends.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "promptcache/cache/compiler.hpp"
#include "promptcache/cache/redis_tier.hpp"
#include "promptcache/cache/store.hpp"
#include "promptcache/cache/tier.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/pml/layout.hpp"

namespace promptcache {

// The key of every stored span of `layout` (index into layout.spans -> 32 hex digits).
std::map<std::size_t, std::string> span_keys(const pml::Layout& layout,
                                             const std::string& model_fingerprint,
                                             torch::Dtype dtype, torch::Dtype kv_dtype,
                                             EncodingMode mode);

struct TierBudgets {
  int64_t host_bytes = 0;    // 0: no limit
  int64_t device_bytes = 0;  // 0: no limit (applies only when the model is not on the CPU)
};

struct TierStats {
  int64_t hits = 0;            // spans a request found in the top tier
  int64_t misses = 0;          // spans a request did not find there
  int64_t promotions = 0;      // of the misses, spans brought up from a lower tier (host, file)
  int64_t file_loads = 0;      // of the promotions, spans re-read from a cache file
  int64_t remote_loads = 0;    // spans read from the remote store (promotions, whole schemas)
  int64_t remote_puts = 0;     // spans written to the remote store
  int64_t compiled_spans = 0;  // spans a schema added had compiled (the recompiles apart)
  int64_t recompiles = 0;      // of the misses, spans found in no tier and compiled again
  int64_t evictions = 0;       // spans dropped from a tier (device or host) over its budget
  int64_t shared = 0;          // spans a schema added found already stored (another schema's)
  // Stored states that failed their checks and were not used (compiled again instead), each
  // reported on stderr: values in the remote store (MAC, format, dtype or shape: an attempt to
  // inject states, another --cache-secret, a value of an earlier version), and states files
  // (a schema's file that is corrupt or stale when it is added, a span re-read from one).
  int64_t remote_rejected = 0;
  int64_t file_rejected = 0;
  int64_t keys = 0;  // distinct spans known (stored in some tier or not)
  int64_t host_spans = 0, host_bytes = 0;
  int64_t device_spans = 0, device_bytes = 0;
  int64_t max_host_bytes = 0, max_device_bytes = 0;
  std::string remote;  // the remote store's URL, "" none
};

// A schema's stored spans as the span store knows them.
// The remote store's key for span `span` of a layout: the model, the layout and the span's key.
std::string remote_key(const std::string& model_fingerprint, const std::string& layout_fingerprint,
                       std::size_t span, const std::string& span_key);

struct SchemaSpans {
  std::string schema;
  std::map<std::size_t, std::string> keys;  // span index -> key
  std::string cache_file;                   // its states file ("" none): the file tier
  std::string layout_fingerprint;           // checked when a span is re-read from the file
};

class SpanStore {
 public:
  // `remote`: the Redis tier (null: none).
  SpanStore(const LlamaModel& model, EncodingMode mode, int64_t chunk_tokens, TierBudgets budgets,
            std::unique_ptr<RedisTier> remote = nullptr);
  ~SpanStore();
  SpanStore(const SpanStore&) = delete;
  SpanStore& operator=(const SpanStore&) = delete;

  // Registers a schema's freshly compiled or loaded states (`states`, its spans): a key already
  // stored keeps its copy (shared, and `states` gets it instead), a new one enters the top tier.
  // `cache_file`: where the schema's states file is ("" none), re-read when a span is evicted.
  // A key stays stored while a SchemaSpans naming it lives: the last one's release drops it from
  // every tier (a schema replaced or removed frees its states). The store must outlive them.
  // `compiled`: the states were compiled now (counted in compiled_spans). With a remote store,
  // compiled spans are written there (replacing its values), loaded ones when it lacks them.
  std::shared_ptr<const SchemaSpans> adopt(const pml::Layout& layout, CacheStore& states,
                                           const std::string& cache_file, bool compiled);

  // Every stored span of `layout` from the remote store into `states` (replacing the schema's
  // there): true when it held them all (and they all passed their checks), else `states` is
  // left as it was. False without a remote store.
  bool load_remote(const pml::Layout& layout, CacheStore& states);
  const RedisTier* remote() const { return remote_.get(); }

  // The states of the stored spans among `spans` (indices into the layout of `schema`), in the
  // top tier, for one request: found there (hit), promoted from a lower tier, or compiled again.
  // Held (never evicted) until the returned Pin is destroyed.
  class Pin;
  Pin pin(const pml::Layout& layout, const SchemaSpans& schema,
          const std::vector<std::size_t>& spans);
  // The id of the top tier's states of `key` (SpanStates::id), 0 when not there; no stats, no
  // change in the LRU order.
  uint64_t resident_id(const std::string& key) const;
  // Whether the top tier holds the block with this id (SpanStates::id).
  bool resident(uint64_t id) const;
  // Called with the id of each block evicted from the top tier, after the store's lock is
  // released (so it may take locks of its own, and call the store): the engine's KV buffer pool
  // lets go of the blocks its idle buffers read in place. Set once, before the store is used.
  void set_eviction_listener(std::function<void(uint64_t id)> listener);

  TierStats stats() const;
  // Counts a states file that failed its checks (TierStats::file_rejected): the engine's, when
  // a schema's file is refused as it is added (the store counts the spans it re-reads itself).
  void count_file_rejected();
  bool budgeted() const { return budgets_.host_bytes > 0 || budgets_.device_bytes > 0; }
  // The model's fingerprint (computed on first use, one short forward).
  const std::string& model_fingerprint();

 private:
  struct Slot;
  using SlotPtr = std::shared_ptr<Slot>;

 public:
  // A request's hold on its spans: given back (and the tiers brought within budget) when it
  // is destroyed.
  class Pin {
   public:
    Pin() = default;
    Pin(Pin&& other) noexcept;
    Pin& operator=(Pin&& other) noexcept;
    ~Pin();
    const CacheStore& states() const { return states_; }

   private:
    friend class SpanStore;
    SpanStore* store_ = nullptr;
    CacheStore states_;
    std::vector<SlotPtr> held_;
  };

 private:
  bool on_device() const;
  // The memory tier requests read: the device's when the model is not on the CPU, else host
  // memory's.
  Tier& top_tier() { return on_device() ? device_ : host_; }
  const Tier& top_tier() const { return on_device() ? device_ : host_; }
  // The top tier's states of `slot`, null when it holds none.
  const SpanStates* top(const Slot& slot) const;
  // Brings `slot` into the top tier (lock held, released while a file is read or a span
  // compiled; `lock` is locked again on return) and returns its states there (for a slot
  // released meanwhile: the states brought, not stored).
  SpanStates promote(std::unique_lock<std::mutex>& lock, const SlotPtr& slot,
                     const pml::Layout& layout, const SchemaSpans& schema, std::size_t span);
  // The lower tiers promote() reads a span missing from memory back from, in this order before
  // it compiles the span again: the span's states (on the model's device), or nullopt when the
  // tier does not hold them or they failed their checks (then `rejected`, for the file; the
  // remote store counts its own). Called without the lock.
  std::optional<SpanStates> read_file(const pml::Layout& layout, const SchemaSpans& schema,
                                      std::size_t span, bool& rejected);
  std::optional<SpanStates> read_remote(const pml::Layout& layout, const SchemaSpans& schema,
                                        std::size_t span, bool& rejected);
  bool attached(const SlotPtr& slot) const;  // still slots_' own
  bool held(const std::string& key) const;   // a request holds it (a Pin's reference)
  void touch(const std::string& key);        // most recently used in every tier that holds it
  void enforce_budgets();
  // The ids evicted from the top tier since the last call (lock held), for notify() after the
  // lock is released.
  std::vector<uint64_t> take_evicted() { return std::exchange(evicted_, {}); }
  void notify(const std::vector<uint64_t>& evicted) const;
  void release(const std::vector<std::string>& keys);
  void unpin(std::vector<SlotPtr>& held);

  const LlamaModel& model_;
  EncodingMode mode_;
  int64_t chunk_tokens_;
  TierBudgets budgets_;
  std::once_flag fingerprint_once_;
  std::string fingerprint_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, SlotPtr> slots_;
  // The memory tiers, one Tier each with its policy: the device demotes what it evicts to host
  // memory; host memory drops it (the lower tiers serve it again).
  Tier host_, device_;
  std::vector<uint64_t> evicted_;  // see take_evicted
  std::function<void(uint64_t)> listener_;
  TierStats stats_;
  std::unique_ptr<RedisTier> remote_;
};

}  // namespace promptcache
