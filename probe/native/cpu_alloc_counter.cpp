// A counting wrapper around c10's CPU allocator: every block allocated through
// c10::GetCPUAllocator() after `trainfit_install` is counted when it is made and when it is
// freed, on whichever thread frees it (gloo's worker threads included, which the profiler's
// memory events do not see). Loaded with ctypes by probe/cpu_memory.py. While paused
// (`trainfit_pause`), blocks are handed out uncounted and freed uncounted: a process-wide
// switch, for the temporaries a collective backend makes while it is being called.
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
c10::Allocator* g_base = nullptr;

struct Block {
  c10::DataPtr base;  // the default allocator's block, freed with this record
  int64_t nbytes;
  bool counted;  // false: made while paused, so its free is not taken off either
};

void raise_peak(int64_t now) {
  int64_t seen = g_peak.load(std::memory_order_relaxed);
  while (now > seen && !g_peak.compare_exchange_weak(seen, now)) {
  }
}

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
    void* data = base.get();
    c10::Device device = base.device();
    auto* block = new Block{std::move(base), static_cast<int64_t>(n), counted};
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_blocks[data] = block;
    }
    if (counted) {
      g_allocs.fetch_add(1);
      raise_peak(g_current.fetch_add(block->nbytes) + block->nbytes);
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
int64_t trainfit_reset_peak() { return g_peak.exchange(g_current.load()); }
}
