// A counting wrapper around c10's CPU allocator: every block allocated through
// c10::GetCPUAllocator() after `trainfit_install` is counted when it is made and when it is
// freed, on whichever thread frees it (gloo's worker threads included, which the profiler's
// memory events do not see). Loaded with ctypes by probe/cpu_memory.py. While paused
// (`trainfit_pause`), blocks are handed out uncounted and freed uncounted: a process-wide
// switch, for the temporaries a collective backend makes while it is being called.
// Once a thread is marked (`trainfit_mark_thread`, the thread that runs the training step),
// blocks allocated on any other thread (a collective backend's workers) are also kept apart:
// `trainfit_other_current` / `trainfit_other_peak` for them, `trainfit_marked_peak` for the
// bytes allocated on marked threads (wherever freed).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_allocs{0};
std::atomic<int> g_paused{0};
std::atomic<int64_t> g_uncounted{0};
std::atomic<bool> g_any_marked{false};
std::atomic<int64_t> g_other_current{0};  // counted blocks allocated on unmarked threads
std::atomic<int64_t> g_other_peak{0};
std::atomic<int64_t> g_marked_peak{0};  // peak of g_current - g_other_current
thread_local bool t_marked = false;
c10::Allocator* g_base = nullptr;

struct Block {
  c10::DataPtr base;  // the default allocator's block, freed with this record
  int64_t nbytes;
  bool counted;  // false: made while paused, so its free is not taken off either
  bool other;  // allocated on an unmarked thread while some thread was marked
};

void raise(std::atomic<int64_t>& peak, int64_t now) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

void raise_peak(int64_t now) { raise(g_peak, now); }

// The DataPtr's context is the data pointer itself, the record is looked up here: c10's
// Allocator::raw_allocate (c10/core/Allocator.h:209) asserts context == data and frees through
// raw_deleter(), which oneDNN's bf16 matmul on the CPU uses (linear in bf16 hit the assert when
// the record was the context).
std::mutex g_mutex;
std::unordered_map<void*, Block*> g_blocks;

void free_block(void* data) {
  Block* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_blocks.find(data);
    if (it == g_blocks.end()) {
      return;
    }
    block = it->second;
    g_blocks.erase(it);
  }
  if (block->counted) {
    if (block->other) {
      g_other_current.fetch_sub(block->nbytes);
    }
    g_current.fetch_sub(block->nbytes);
  }
  delete block;  // frees the default allocator's block
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr base = g_base->allocate(n);
    if (n == 0) {
      return base;
    }
    // recorded either way, so that raw_deleter() can free a paused block too
    const bool counted = g_paused.load() == 0;
    const bool other = g_any_marked.load() && !t_marked;
    void* data = base.get();
    c10::Device device = base.device();
    auto* block = new Block{std::move(base), static_cast<int64_t>(n), counted, other};
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_blocks[data] = block;
    }
    if (counted) {
      g_allocs.fetch_add(1);
      if (other) {
        raise(g_other_peak, g_other_current.fetch_add(block->nbytes) + block->nbytes);
      }
      const int64_t now = g_current.fetch_add(block->nbytes) + block->nbytes;
      raise_peak(now);
      if (!other) {
        raise(g_marked_peak, now - g_other_current.load());
      }
    } else {
      g_uncounted.fetch_add(block->nbytes);
    }
    return {data, data, &free_block, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator g_counting;

}  // namespace

extern "C" {
// Put the counter in front of the CPU allocator (once; later calls do nothing).
int trainfit_install() {
  if (g_base != nullptr) {
    return 0;
  }
  g_base = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&g_counting, /*priority=*/100);
  return c10::GetCPUAllocator() == &g_counting ? 1 : -1;
}
int64_t trainfit_current() { return g_current.load(); }
int64_t trainfit_peak() { return g_peak.load(); }
int64_t trainfit_allocs() { return g_allocs.load(); }
// Bytes handed out uncounted while paused (a running total, for the record).
int64_t trainfit_uncounted() { return g_uncounted.load(); }
// Pause (on != 0) or resume (on == 0) counting; nested pauses add up.
void trainfit_pause(int on) { g_paused.fetch_add(on ? 1 : -1); }
// Start a new peak window at the bytes alive now; returns the previous window's peak.
// The marked and other-thread peaks start their windows too (read them first).
int64_t trainfit_reset_peak() {
  const int64_t other = g_other_current.load();
  g_other_peak.store(other);
  g_marked_peak.store(g_current.load() - other);
  return g_peak.exchange(g_current.load());
}
// Mark the calling thread as the training thread (see the top of the file).
void trainfit_mark_thread() {
  t_marked = true;
  g_any_marked.store(true);
}
int64_t trainfit_other_current() { return g_other_current.load(); }
int64_t trainfit_other_peak() { return g_other_peak.load(); }
int64_t trainfit_marked_peak() { return g_marked_peak.load(); }
}
