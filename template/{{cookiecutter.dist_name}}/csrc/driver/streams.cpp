// Emulated implementation of driver.h, part 2: streams, events, queued work and tracing, with the
// optional capabilities host_tasks (launch_host, hold_stream/release_stream), spin and tracing.
//
// Each device has one worker thread, its "hardware". Work launched on a stream (kernels, copies,
// event records, waits on events, sleeps) joins the stream's queue and returns at once; the worker
// runs every stream's queue in order, picking among streams with runnable work by priority. A
// stream whose head is a wait on an incomplete event, or a sleep, lets the other streams run. So,
// as on a real accelerator, an event may not be complete when queried, one stream does not see
// another's writes without a wait, and the host sees the device's writes only after a
// synchronize. Work that must finish before the host goes on (blocking copies, kernels whose
// outputs the host needs) runs on the calling thread once the stream has drained
// (hold_stream/release_stream, run_blocking) — still the stream's next item, so ordering
// holds. A kernel launch takes no lock while nothing on its device is captured or held: it goes
// into the stream's Inbox, which whoever next holds the lock moves into the stream's queue.
//
// What a hardware team replaces: this whole file, with the SDK's streams, events and launches; the
// activity records come from its tracing API (CUPTI-like).
#include "driver/driver.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <pthread.h>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "driver/emulator.h"

namespace {{ cookiecutter.device }}::driver {
namespace streams_impl {

using Clock = std::chrono::steady_clock;

struct Stream;

// One record of an event on a stream: done when the stream reaches it. A record made on a capturing
// stream is a point of the capture (`capture`, `by`, `node`): waiting for it joins the capture.
struct Record {
  bool done = false;
  Clock::time_point when{};
  uint64_t capture = 0;
  Stream* by = nullptr;
  size_t node = 0;  // the capture's nodes before it
};

struct Event {
  bool timing = false;
  std::shared_ptr<Record> last;  // the most recent record (waits and queries refer to it)
};

struct Item {
  enum Kind { work, record, wait, sleep } kind = work;
  Activity::Kind activity = Activity::kernel;
  const char* name = "";
  std::function<void()> fn;
  std::shared_ptr<Record> rec;
  int64_t us = 0;
  uint64_t correlation = 0;
};

struct Capture;

// A bounded queue that any thread pushes to and pops from without a lock (Vyukov's): a thread
// claims a slot by advancing `tail_` (push) or `head_` (pop) and hands it over through the slot's
// `seq`. Each slot has a cache line of its own: one thread fills a slot while another empties the
// one before it.
template <typename T, uint64_t N>
class Ring {
  static_assert((N & (N - 1)) == 0, "N must be a power of two");

 public:
  Ring() {
    for (uint64_t i = 0; i < N; ++i) slots_[i].seq.store(i, std::memory_order_relaxed);
  }
  // False when full (`value` is then left as it was).
  bool push(T& value) {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& slot = slots_[pos & (N - 1)];
      const auto diff = static_cast<int64_t>(slot.seq.load(std::memory_order_acquire) - pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          slot.value = std::move(value);
          slot.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }
  // False when nothing is published at the head.
  bool pop(T& out) {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& slot = slots_[pos & (N - 1)];
      const auto diff = static_cast<int64_t>(slot.seq.load(std::memory_order_acquire) - (pos + 1));
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          out = std::move(slot.value);
          slot.value = T();
          slot.seq.store(pos + N, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }
  // Whether a push claimed a slot that no pop has taken yet (published or about to be).
  bool pending() const { return tail_.load(std::memory_order_acquire) != head_.load(std::memory_order_acquire); }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};
    T value;
  };
  std::unique_ptr<Slot[]> slots_{new Slot[N]};
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) std::atomic<uint64_t> head_{0};
};

// The lock-free way into a stream for launched work (enqueue's fast path, `post`): any host thread
// pushes, and whoever holds State::mu moves what was pushed, in order, into the stream's queue
// (Stream::drain: the worker before it picks work, and every call that looks at the stream). A
// launching thread and the worker then share no lock at a launch: on two cores the lock, taken by
// both at every small launch, was the largest cost of the launch. Full, launches take the lock.
using Inbox = Ring<Item, 512>;

struct Stream {
  int device = 0;
  int64_t id = 0;
  int priority = 0;
  std::deque<Item> queue;
  std::atomic<Inbox*> inbox{nullptr};  // made by the first launch through the lock (enqueue)
  bool running = false;  // the worker is running the head item
  int held = 0;          // enter_stream depth of the holding thread
  std::thread::id holder;
  int64_t held_since_ns = 0;
  bool sleeping = false;
  Clock::time_point wake{};
  int64_t sleep_start_ns = 0;
  Capture* capture = nullptr;  // the capture it records into (graphs)
  size_t own_last = 0;         // a stream forked into a capture: the capture's nodes up to its last one
  size_t joined = 0;           // ... and up to the last one a stream of the capture waited for

  bool idle() const { return queue.empty() && !running && held == 0 && !inbox_pending(); }
  bool inbox_pending() const {
    const Inbox* in = inbox.load(std::memory_order_relaxed);
    return in != nullptr && in->pending();
  }
  void drain() {  // mu held
    Inbox* in = inbox.load(std::memory_order_relaxed);
    if (in == nullptr) return;
    Item item;
    while (in->pop(item)) queue.push_back(std::move(item));
  }
  bool held_by_me() const { return held > 0 && holder == std::this_thread::get_id(); }
};

// Recorded work (graphs): an item as it was launched, on the stream it was launched on.
struct Node {
  Item item;
  int64_t stream = 0;
};

// A capture under way: its origin stream, the streams forked into it, what it recorded so far.
struct Capture {
  uint64_t id = 0;
  int device = 0;
  Stream* origin = nullptr;
  CaptureMode mode = CaptureMode::global;
  std::thread::id thread;  // the thread that began it (thread_local mode)
  std::vector<Node> nodes;
  std::vector<Stream*> members;
  std::vector<std::shared_ptr<Record>> records;
  bool broken = false;
  std::string why;  // the call that broke it
};

struct Device {
  std::vector<Stream*> order;  // by priority (lower value first), then creation
  std::unordered_map<int64_t, Stream*> by_id;
  int64_t next_id = 1;
  bool worker = false;
  bool busy = false;  // a batch of its work is running (on the worker or a waiting host thread)
  std::vector<Capture*> captures;  // under way on its streams
  // Captures under way plus streams held: while nonzero, launches take the lock (enqueue), which
  // records them into a capture, runs them in a held stream's order or refuses them.
  alignas(64) std::atomic<int> locked_only{0};
};

struct State {
  std::mutex mu;  // everything below, for every device
  std::condition_variable cv;  // any stream, event or worker changed (see notify)
  std::atomic<int> waiting{0};  // threads blocked on cv: a launch makes a system call only for them
  std::atomic<uint64_t> changes{0};  // bumped by notify and post: an idle worker, a waiting host thread spin on it
  std::vector<Device> devices;
  bool failed = false;
  std::string error;
  std::atomic<bool> tracing{false};
  std::vector<Activity> activities;
  uint64_t next_capture = 1;
  std::string capture_error;  // what the last refused call during a capture was
  std::vector<std::function<void()>> finished;  // work a worker ran, for a host thread to destroy (Reaper)
  // ... the same without the lock: a worker leaves what it ran here first, and a launch that takes
  // no lock (post) destroys some of it
  Ring<std::function<void()>, 256> graveyard;

  State() : devices(static_cast<size_t>(std::max(device_count(), 0))) {}
};

State& state() {
  static State* s = [] {
    auto* st = new State();  // never destroyed: workers and static destructors may still use it
    pthread_atfork(nullptr, nullptr, [] {
      new (&state().mu) std::mutex();  // the child has no workers; the parent's locks mean nothing
      new (&state().cv) std::condition_variable();
      state().waiting.store(0);
    });
    return st;
  }();
  return *s;
}

// Something a thread may be waiting for changed (mu held). A launch costs no system call while the
// worker is busy or spinning.
void notify(State& s) {
  s.changes.fetch_add(1, std::memory_order_release);
  if (s.waiting > 0) s.cv.notify_all();
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

// Takes State::mu through `lock`, trying for a moment before it blocks: mu is held for well under a
// microsecond at a time, while a thread that blocks on it pays a futex sleep and its holder a
// wake-up system call, several microseconds each (a host thread launching small kernels and the
// worker taking them meet on mu at every launch).
void acquire(std::unique_lock<std::mutex>& lock) {
  for (int i = 0; i < 256; ++i) {
    if (lock.try_lock()) return;
    cpu_relax();
  }
  lock.lock();
}

// Destroys, on a host thread, the work a worker finished. What a launch captured (its closure, the
// holds of its tensors) was allocated by the launching thread; freed by the worker, each block would
// take malloc's lock of that thread's arena while the launching thread allocates the next launch
// there, and the two would queue on it at every small launch. So the worker leaves its finished
// work in State::graveyard (or, full, State::finished), a launch that takes no lock destroys two of
// the graveyard's (post), and a host thread that takes the lock to launch or synchronize takes the
// rest (take, mu held) and destroys them when the Reaper goes out of scope, after mu is released:
// declare the Reaper before the lock. Queued work holds memory and geometry, not tensors
// (kernel_support.h), so nothing a user holds lives longer: only the closures' host memory is freed
// a launch later. A destructor that calls back into the driver does so with mu free, under a
// Reaper of its own (post destroys its two with no lock held).
class Reaper {
 public:
  Reaper() = default;
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;
  void take(State& s) {
    std::function<void()> fn;
    while (s.graveyard.pop(fn)) spare().push_back(std::move(fn));
    if (s.finished.empty()) return;
    if (spare().empty()) {
      spare().swap(s.finished);  // s.finished keeps the spare's capacity: no allocation either side
    } else {
      for (auto& fn : s.finished) spare().push_back(std::move(fn));
      s.finished.clear();
    }
  }
  ~Reaper() {
    std::vector<std::function<void()>> dying;
    dying.swap(spare());
    dying.clear();  // the captures' destructors run here, outside mu
    if (spare().capacity() == 0) spare().swap(dying);
  }

 private:
  static std::vector<std::function<void()>>& spare() {
    thread_local std::vector<std::function<void()>> v;
    return v;
  }
};

// How long a host thread waiting for the device (synchronize, a blocking copy, a kernel run in
// stream order) watches for the work to finish before it sleeps: a small kernel's round trip is
// then a few microseconds, not a sleep and a wake-up (a system call on each side, and the
// scheduler's latency). CUDA's default (cudaDeviceScheduleAuto) spins too while the host has
// cores to spare.
constexpr int64_t kWaitSpinUs = 100;

bool step(State& s, std::unique_lock<std::mutex>& lock, int device, std::chrono::steady_clock::time_point& wake);

// Blocks until pred() holds (mu held through `lock`). While it waits, the calling thread runs
// `device`'s next queued work itself when the device is idle (step; -1: none), then spins for
// kWaitSpinUs in all, re-checking after every change (notify), then sleeps on cv.
template <typename Pred>
void wait_until_true(State& s, std::unique_lock<std::mutex>& lock, int device, Pred pred) {
  using Clock = std::chrono::steady_clock;
  if (pred()) return;
  const Clock::time_point spin_until = Clock::now() + std::chrono::microseconds(kWaitSpinUs);
  while (!pred()) {
    Clock::time_point wake = Clock::time_point::max();
    if (device >= 0 && step(s, lock, device, wake)) continue;
    const uint64_t seen = s.changes.load(std::memory_order_acquire);
    if (Clock::now() < spin_until) {
      lock.unlock();
      for (int i = 0; s.changes.load(std::memory_order_acquire) == seen; ++i) {
        if ((i & 63) == 63 && Clock::now() >= spin_until) break;
        cpu_relax();
      }
      acquire(lock);
      continue;
    }
    ++s.waiting;
    if (wake == Clock::time_point::max()) {
      s.cv.wait(lock);
    } else {
      s.cv.wait_until(lock, wake);
    }
    --s.waiting;
  }
}

thread_local uint64_t correlation_id = 0;
extern thread_local bool on_worker;  // set on the devices' worker threads

bool valid_device(int device) { return device >= 0 && device < device_count(); }

// The stream (device, id); ids the driver did not create (0, the default) are made on first use.
// Its inbox is drained: whatever the caller does next with the stream comes after the work launched
// on it so far.
Stream* find_stream(State& s, int device, int64_t id) {
  Device& d = s.devices[device];
  auto it = d.by_id.find(id);
  if (it != d.by_id.end()) {
    it->second->drain();
    return it->second;
  }
  auto* st = new Stream();
  st->device = device;
  st->id = id;
  d.by_id.emplace(id, st);
  d.order.push_back(st);  // priority 0: after the high-priority streams, in creation order
  return st;
}

void trace(State& s, Activity::Kind kind, const char* name, int device, int64_t stream, int64_t start, int64_t end,
           uint64_t correlation) {  // mu held
  Activity a;
  a.kind = kind;
  a.name = name != nullptr ? name : "";
  a.device = device;
  a.stream = stream;
  a.start_ns = start;
  a.end_ns = end;
  a.correlation = correlation;
  s.activities.push_back(std::move(a));
}

void fail(State& s, const char* name, const char* what) {  // mu held
  if (s.failed) return;  // the first failure is the one to report
  s.failed = true;
  s.error = std::string("work queued on the device failed (") + (name ? name : "?") + "): " + what;
}

// Refuses a call during capture `c` (mu held): the capture is broken, and the call returns
// capture_unsupported with a message naming it (status_string).
Status refuse(State& s, Capture* c, const std::string& what) {
  if (!c->broken) {
    c->broken = true;
    c->why = what;
  }
  s.capture_error = "operation not permitted when stream is capturing: " + what + " (stream " +
                    std::to_string(c->origin->id) + " of device " + std::to_string(c->device) +
                    " is capturing a graph; the capture is now invalid)";
  return Status::capture_unsupported;
}

// A capture of the device whose mode forbids a potentially unsafe call on this thread: any thread
// for global, its own thread for thread_local, none for relaxed (mu held).
Capture* forbidding(State& s, int device) {
  for (Capture* c : s.devices[device].captures) {
    if (c->mode == CaptureMode::global) return c;
    if (c->mode == CaptureMode::thread_local_ && c->thread == std::this_thread::get_id()) return c;
  }
  return nullptr;
}

Status refuse_unsafe(State& s, int device, const std::string& what) {
  Capture* c = forbidding(s, device);
  return c == nullptr ? Status::ok : refuse(s, c, what);
}

// Refuses `what` (with `name`, the work's) on the default stream 0 of a device where a capture
// forbids potentially unsafe calls on this thread (mu held); ok elsewhere.
Status refuse_on_default_stream(State& s, int device, int64_t stream, const char* what, const char* name = nullptr) {
  if (stream != 0 || s.devices[device].captures.empty()) return Status::ok;
  return refuse_unsafe(s, device, name == nullptr ? std::string(what) : std::string(what) + " (" + name + ")");
}

// The capture of a record made in one, still under way (mu held).
Capture* capture_of(const Record& rec) {
  return rec.capture != 0 && rec.by != nullptr && rec.by->capture != nullptr && rec.by->capture->id == rec.capture
             ? rec.by->capture
             : nullptr;
}

constexpr int64_t kSpinUs = 50;  // how long an idle worker watches for work before it sleeps
constexpr size_t kBatch = 32;    // work items a worker takes from a stream at once

// One step of the device's "hardware" (mu held through `lock`): completes the records, waits and
// sleeps at the heads of its streams, or runs the next work items of one stream — up to kBatch of
// them up to its next record or wait, outside the lock (a host launching small kernels and the
// runner then rarely meet on the lock). One batch runs at a time on a device, whoever runs it: its
// worker, or a host thread waiting for the device (see wait_until_true), which runs it exactly as
// the worker would — so a small kernel's round trip costs no thread handoff. Returns whether
// anything changed; else `wake` is when a sleep at a stream's head ends.
bool step(State& s, std::unique_lock<std::mutex>& lock, int device, Clock::time_point& wake) {
  Device& d = s.devices[device];
  if (d.busy) return false;
  const Clock::time_point now = Clock::now();
  wake = Clock::time_point::max();
  Stream* pick = nullptr;
  bool progressed = false;
  for (Stream* st : d.order) {
    st->drain();
    if (st->running || st->held > 0 || st->queue.empty()) continue;
    Item& head = st->queue.front();
    switch (head.kind) {
      case Item::record:
        head.rec->when = now;
        head.rec->done = true;
        st->queue.pop_front();
        progressed = true;
        break;
      case Item::wait:
        if (head.rec->done) {
          st->queue.pop_front();
          progressed = true;
        }
        break;
      case Item::sleep:
        if (!st->sleeping) {
          st->sleeping = true;
          st->wake = now + std::chrono::microseconds(head.us);
          st->sleep_start_ns = now_ns();
        }
        if (now >= st->wake) {
          if (s.tracing) trace(s, Activity::spin, "sleep", device, st->id, st->sleep_start_ns, now_ns(), head.correlation);
          st->sleeping = false;
          st->queue.pop_front();
          progressed = true;
        } else {
          wake = std::min(wake, st->wake);
        }
        break;
      case Item::work:
        if (pick == nullptr) pick = st;
        break;
    }
  }
  if (progressed) {
    notify(s);
    return true;
  }
  if (pick == nullptr) return false;
  std::vector<Item> batch;  // small: moved items (their work's captures stay where they were)
  batch.reserve(std::min(pick->queue.size(), kBatch));
  while (!pick->queue.empty() && pick->queue.front().kind == Item::work && batch.size() < kBatch) {
    batch.push_back(std::move(pick->queue.front()));
    pick->queue.pop_front();
  }
  pick->running = true;
  d.busy = true;
  const bool tracing = s.tracing;
  lock.unlock();
  const bool was_worker = on_worker;
  on_worker = true;  // work that frees memory does not wait for the queue it is part of
  std::vector<int64_t> times(batch.size() * (tracing ? 2 : 0), 0);
  const char* failed = nullptr;
  std::string what;
  for (size_t i = 0; i < batch.size(); ++i) {
    Item& item = batch[i];
    if (tracing) times[2 * i] = now_ns();
    try {
      item.fn();
    } catch (const std::exception& e) {
      if (failed == nullptr) {
        what = e.what();
        failed = item.name;
      }
    } catch (...) {
      if (failed == nullptr) {
        what = "unknown exception";
        failed = item.name;
      }
    }
    if (tracing) times[2 * i + 1] = now_ns();
    if (!was_worker) item.fn = nullptr;  // a host thread ran it: destroy what it captured before taking the lock
  }
  on_worker = was_worker;
  acquire(lock);
  if (was_worker) {
    for (Item& item : batch) {  // for a host thread to destroy (Reaper, post)
      if (!s.graveyard.push(item.fn)) s.finished.push_back(std::move(item.fn));
    }
  }
  if (tracing) {
    for (size_t i = 0; i < batch.size(); ++i) {
      trace(s, batch[i].activity, batch[i].name, device, pick->id, times[2 * i], times[2 * i + 1],
            batch[i].correlation);
    }
  }
  if (failed != nullptr) fail(s, failed, what.c_str());
  pick->running = false;
  d.busy = false;
  notify(s);
  return true;
}

// The device's "hardware": runs queued work of all its streams until the process ends.
void worker(int device) {
  on_worker = true;
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    // Read before step drains the inboxes: a launch that takes no lock (post) publishes its work,
    // then bumps `changes`; work step did not see was published after this, and changes it.
    const uint64_t seen = s.changes.load();
    Clock::time_point wake;
    if (step(s, lock, device, wake)) continue;
    // Nothing to run: spin a little before sleeping, as a launch usually follows soon (a
    // host thread launching small kernels then never waits for a wake-up).
    lock.unlock();
    const Clock::time_point spin_until = std::min(wake, Clock::now() + std::chrono::microseconds(kSpinUs));
    while (s.changes.load(std::memory_order_acquire) == seen && Clock::now() < spin_until) cpu_relax();
    acquire(lock);
    // `waiting` before `changes` (both sequentially consistent): a launch that took no lock (post)
    // bumps `changes` before it reads `waiting`, so either this sees its change or it sees this waiter.
    s.waiting.fetch_add(1);
    if (s.changes.load() != seen) {
      s.waiting.fetch_sub(1);
      continue;
    }
    if (wake == Clock::time_point::max()) {
      s.cv.wait(lock);
    } else {
      s.cv.wait_until(lock, wake);
    }
    s.waiting.fetch_sub(1);
  }
}

// Whether `device` can take work now: not in a bad fork, a device of the machine, the driver started.
Status usable(int device) {
  if (emulator::in_bad_fork()) return Status::forked;
  if (!valid_device(device)) return Status::invalid_device;
  return init();
}

// The streams this thread last launched on through the lock, for post (streams live as long as
// the process).
struct Remembered {
  int device = -1;
  int64_t id = 0;
  Stream* stream = nullptr;
  Inbox* inbox = nullptr;  // the stream's (it never changes once made)
};
constexpr size_t kRemembered = 4;
thread_local Remembered remembered[kRemembered];
thread_local size_t next_remembered = 0;

void remember(int device, int64_t id, Stream* st) {
  Inbox* in = st->inbox.load(std::memory_order_relaxed);
  for (Remembered& r : remembered) {
    if (r.stream == st) {
      r.inbox = in;  // made since (the first launch of work on the stream)
      return;
    }
  }
  remembered[next_remembered++ % kRemembered] = Remembered{device, id, st, in};
}

Inbox* remembered_inbox(int device, int64_t id) {
  for (const Remembered& r : remembered) {
    if (r.device == device && r.id == id) return r.inbox;
  }
  return nullptr;
}

// enqueue's way without the lock: work launched on a stream this thread has launched on before,
// while its device has no capture under way and no stream held (Device::locked_only), goes into
// the stream's inbox. False: enqueue takes the lock. A launch racing another thread's capture or
// hold on the device may still go this way; it is then ordered as if made just before it.
bool post(State& s, int device, int64_t stream, Item& item) {
  if (s.devices[device].locked_only.load(std::memory_order_acquire) != 0) return false;
  Inbox* in = remembered_inbox(device, stream);
  if (in == nullptr) return false;
  item.correlation = correlation_id;
  if (!in->push(item)) return false;
  s.changes.fetch_add(1);  // then `waiting`, both sequentially consistent (see worker)
  if (s.waiting.load() > 0) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.cv.notify_all();
  }
  // the closures of two items the worker ran, destroyed here (see Reaper): as many as are launched
  std::function<void()> spent;
  for (int i = 0; i < 2 && s.graveyard.pop(spent); ++i) spent = nullptr;
  return true;
}

Status enqueue(int device, int64_t stream, Item item) {
  if (Status ready = usable(device); ready != Status::ok) return ready;
  State& s = state();
  if (item.kind == Item::work && post(s, device, stream, item)) return Status::ok;
  Reaper reaper;
  std::unique_lock<std::mutex> lock(s.mu, std::defer_lock);
  acquire(lock);
  reaper.take(s);
  Stream* st = find_stream(s, device, stream);
  if (st->capture != nullptr) {  // recorded into the graph, not run
    Capture* c = st->capture;
    if (c->broken) return Status::capture_invalidated;
    c->nodes.push_back(Node{std::move(item), stream});
    st->own_last = c->nodes.size();
    return Status::ok;
  }
  if (Status refused = refuse_on_default_stream(s, device, stream, "work launched on the default stream",
                                                item.name != nullptr ? item.name : "?");
      refused != Status::ok) {
    return refused;
  }
  if (item.kind == Item::work && st->held_by_me()) {
    // Launched from inside the stream's own current item: it is the next thing the stream runs.
    lock.unlock();
    item.fn();
    return Status::ok;
  }
  item.correlation = correlation_id;
  if (item.kind == Item::work && st->inbox.load(std::memory_order_relaxed) == nullptr) {
    st->inbox.store(new Inbox(), std::memory_order_release);  // lives as long as the stream
  }
  st->queue.push_back(std::move(item));
  Device& d = s.devices[device];
  if (!d.worker) {
    std::thread(worker, device).detach();
    d.worker = true;
  }
  remember(device, stream, st);
  notify(s);
  return Status::ok;
}

// Reports (once) a failure of earlier queued work; mu held.
Status take_failure(State& s) {
  if (!s.failed) return Status::ok;
  s.failed = false;
  return Status::launch_failed;
}

// Waits until no queued work of `device` runs or waits to run (driver::free, before it unmaps
// memory queued kernels may still read: cudaFree synchronizes too). Leaves a failure to be
// reported by the next synchronizing call. A no-op on a worker thread (work freeing memory) and for
// streams the calling thread holds.
thread_local bool on_worker = false;

void wait_for_queued_work(int device) {
  if (on_worker || !valid_device(device)) return;
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  Device& d = s.devices[device];
  wait_until_true(s, lock, device, [&] {
    return std::all_of(d.order.begin(), d.order.end(), [](const Stream* st) { return st->idle() || st->held_by_me(); });
  });
}

}  // namespace streams_impl

using namespace streams_impl;

const char* last_launch_error() { return state().error.c_str(); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

Status stream_create(int device, int priority, int64_t* stream) {
  if (emulator::in_bad_fork()) return Status::forked;
  if (!valid_device(device)) return Status::invalid_device;
  int least = 0, greatest = 0;
  stream_priority_range(&least, &greatest);
  priority = std::min(std::max(priority, greatest), least);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  Device& d = s.devices[device];
  int64_t id = d.next_id++;
  while (d.by_id.count(id)) id = d.next_id++;
  auto* st = new Stream();  // streams live as long as the process, like a pool of hardware queues
  st->device = device;
  st->id = id;
  st->priority = priority;
  d.by_id.emplace(id, st);
  auto pos = std::upper_bound(d.order.begin(), d.order.end(), priority,
                              [](int p, const Stream* other) { return p < other->priority; });
  d.order.insert(pos, st);
  *stream = id;
  return Status::ok;
}

Status stream_priority_range(int* least, int* greatest) {
  *least = 0;
  *greatest = -1;
  return Status::ok;
}

Status stream_synchronize(int device, int64_t stream) {
  if (emulator::in_bad_fork()) return Status::forked;
  if (!valid_device(device)) return Status::invalid_device;
  State& s = state();
  Reaper reaper;
  std::unique_lock<std::mutex> lock(s.mu);
  Stream* st = find_stream(s, device, stream);
  if (st->capture != nullptr) return refuse(s, st->capture, "synchronizing the capturing stream");
  if (Status refused = refuse_on_default_stream(s, device, stream, "synchronizing the default stream"); refused != Status::ok) {
    return refused;
  }
  if (!st->held_by_me()) wait_until_true(s, lock, device, [&] { return st->idle(); });
  reaper.take(s);
  return take_failure(s);
}

Status device_synchronize(int device) {
  if (emulator::in_bad_fork()) return Status::forked;
  if (!valid_device(device)) return Status::invalid_device;
  State& s = state();
  Reaper reaper;
  std::unique_lock<std::mutex> lock(s.mu);
  Device& d = s.devices[device];
  if (!d.captures.empty()) {
    Status refused = Status::ok;
    for (Capture* c : d.captures) refused = refuse(s, c, "synchronizing the device");
    return refused;
  }
  wait_until_true(s, lock, device, [&] {
    return std::all_of(d.order.begin(), d.order.end(), [](const Stream* st) { return st->idle() || st->held_by_me(); });
  });
  reaper.take(s);
  return take_failure(s);
}

Status stream_query(int device, int64_t stream) {
  if (!valid_device(device)) return Status::invalid_device;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  Stream* st = find_stream(s, device, stream);
  if (st->capture != nullptr) return refuse(s, st->capture, "querying the capturing stream");
  return st->idle() ? Status::ok : Status::not_ready;
}

Status stream_wait_event(int device, int64_t stream, void* event) {
  if (!valid_device(device)) return Status::invalid_device;
  std::shared_ptr<Record> rec;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    rec = static_cast<Event*>(event)->last;
    if (rec == nullptr || rec->done) return Status::ok;  // nothing to wait for
    Stream* st = find_stream(s, device, stream);
    if (Capture* c = capture_of(*rec)) {  // a point of a capture: the stream joins it
      if (st->capture == nullptr) {
        st->capture = c;
        st->own_last = st->joined = 0;
        c->members.push_back(st);
      } else if (st->capture != c) {
        return refuse(s, c, "a stream of another capture waiting for an event recorded in this one");
      }
      if (rec->by != st) rec->by->joined = std::max(rec->by->joined, rec->node);
      return Status::ok;  // a graph runs its work in capture order: the dependency holds
    }
    // A capture cannot wait for work outside it: when the graph runs, that work was queued long
    // before, and the wait at capture time orders nothing the graph needs.
    if (st->capture != nullptr) return Status::ok;
  }
  Item item;
  item.kind = Item::wait;
  item.name = "wait for an event";
  item.rec = std::move(rec);
  return enqueue(device, stream, std::move(item));
}

Status memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, int device, int64_t stream) {
  if (bytes == 0) return Status::ok;
  if (dst == nullptr || src == nullptr) return Status::invalid_value;
  if (device < 0) get_device(&device);
  void* d = host_address(dst);
  const void* h = host_address(src);
  if (kind == CopyKind::host_to_host) {  // no device involved: nothing to order against
    std::memmove(dst, src, bytes);
    return Status::ok;
  }
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (valid_device(device) && !s.devices[device].captures.empty()) {
      Stream* st = find_stream(s, device, stream);
      const char* what = kind == CopyKind::host_to_device   ? "a blocking copy (host to device)"
                         : kind == CopyKind::device_to_host ? "a blocking copy (device to host: .item(), .cpu(), .tolist())"
                                                            : "a blocking copy (device to device)";
      if (st->capture != nullptr) return refuse(s, st->capture, what);
    }
  }
  return emulator::run_blocking(device, stream, nullptr, [&] {
    const int64_t start = state().tracing ? now_ns() : 0;
    std::memmove(d != nullptr ? d : dst, h != nullptr ? h : src, bytes);
    if (start != 0) {
      std::lock_guard<std::mutex> lock(state().mu);
      trace(state(), Activity::memcpy, "memcpy", device, stream, start, now_ns(), correlation_id);
    }
  });
}

Status memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, int device, int64_t stream) {
  if (bytes == 0) return Status::ok;
  if (dst == nullptr || src == nullptr) return Status::invalid_value;
  void* d = host_address(dst);
  const void* h = host_address(src);
  char* to = static_cast<char*>(d != nullptr ? d : dst);
  const char* from = static_cast<const char*>(h != nullptr ? h : src);
  Item item;
  item.name = kind == CopyKind::host_to_device ? "memcpy host to device"
              : kind == CopyKind::device_to_host ? "memcpy device to host"
                                                   : "memcpy device to device";
  item.activity = Activity::memcpy;
  item.fn = [to, from, bytes] { std::memmove(to, from, bytes); };
  return enqueue(device, stream, std::move(item));
}

Status event_create(void** event, bool timing) {
  auto* e = new (std::nothrow) Event();
  if (e == nullptr) return Status::out_of_memory;
  e->timing = timing;
  *event = e;
  return Status::ok;
}

Status event_destroy(void* event) {
  std::lock_guard<std::mutex> lock(state().mu);  // a queued record keeps its Record, not the Event
  delete static_cast<Event*>(event);
  return Status::ok;
}

Status event_record(void* event, int device, int64_t stream) {
  if (emulator::in_bad_fork()) return Status::forked;
  if (!valid_device(device)) return Status::invalid_device;
  auto rec = std::make_shared<Record>();
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    Stream* st = find_stream(s, device, stream);
    if (Capture* c = st->capture) {  // a point of the capture, not work
      if (c->broken) return Status::capture_invalidated;
      rec->capture = c->id;
      rec->by = st;
      rec->node = c->nodes.size();
      c->records.push_back(rec);
      static_cast<Event*>(event)->last = rec;
      return Status::ok;
    }
    if (Status refused = refuse_on_default_stream(s, device, stream, "recording an event on the default stream"); refused != Status::ok) {
      return refused;
    }
    static_cast<Event*>(event)->last = rec;
    if (st->idle() || (st->held_by_me() && st->queue.empty())) {  // nothing queued before it
      rec->when = Clock::now();
      rec->done = true;
      notify(s);
      return Status::ok;
    }
  }
  Item item;
  item.kind = Item::record;
  item.rec = std::move(rec);
  return enqueue(device, stream, std::move(item));
}

Status event_query(void* event) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto& rec = static_cast<Event*>(event)->last;
  if (rec != nullptr && !rec->done) {
    if (Capture* c = capture_of(*rec)) return refuse(s, c, "querying an event recorded in the capture");
  }
  return rec == nullptr || rec->done ? Status::ok : Status::not_ready;
}

Status event_synchronize(void* event) {
  State& s = state();
  Reaper reaper;
  std::unique_lock<std::mutex> lock(s.mu);
  std::shared_ptr<Record> rec = static_cast<Event*>(event)->last;
  if (rec != nullptr && !rec->done) {
    if (Capture* c = capture_of(*rec)) return refuse(s, c, "synchronizing an event recorded in the capture");
  }
  if (rec != nullptr) wait_until_true(s, lock, -1, [&] { return rec->done; });
  reaper.take(s);
  return take_failure(s);
}

Status event_elapsed_ms(float* ms, void* start, void* end) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto* a = static_cast<Event*>(start);
  auto* b = static_cast<Event*>(end);
  if (!a->timing || !b->timing || a->last == nullptr || b->last == nullptr) return Status::invalid_value;
  if (!a->last->done || !b->last->done) return Status::not_ready;
  *ms = std::chrono::duration<float, std::milli>(b->last->when - a->last->when).count();
  return Status::ok;
}

void set_tracing(bool on) { state().tracing = on; }

std::vector<Activity> take_activities() {
  std::lock_guard<std::mutex> lock(state().mu);
  std::vector<Activity> out;
  out.swap(state().activities);
  return out;
}

void set_correlation(uint64_t id) { correlation_id = id; }

}  // namespace {{ cookiecutter.device }}::driver

// driver.h's optional capabilities host_tasks and spin: host code queued on a stream or run in its
// order, and the spin test aid
namespace {{ cookiecutter.device }}::driver {

using namespace streams_impl;

Status launch_host(int device, int64_t stream, const char* name, std::function<void()> work) {
  Item item;
  item.name = name;
  item.fn = std::move(work);
  return enqueue(device, stream, std::move(item));
}

Status hold_stream(int device, int64_t stream) {
  if (emulator::in_bad_fork()) return Status::forked;
  if (!valid_device(device)) return Status::invalid_device;
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  Stream* st = find_stream(s, device, stream);
  if (st->capture != nullptr) {
    return refuse(s, st->capture,
                  "waiting for the capturing stream (a host read of device memory such as .item() or .cpu(), "
                  "a blocking copy, an operator whose result size depends on the data, or one run on the calling "
                  "thread)");
  }
  if (Status refused = refuse_on_default_stream(s, device, stream, "waiting for the default stream"); refused != Status::ok) {
    return refused;
  }
  if (st->held_by_me()) {
    ++st->held;
    return Status::ok;
  }
  wait_until_true(s, lock, device, [&] { return st->idle(); });
  Status failure = take_failure(s);
  if (failure != Status::ok) return failure;
  st->held = 1;
  st->holder = std::this_thread::get_id();
  s.devices[device].locked_only.fetch_add(1);
  if (s.tracing) st->held_since_ns = now_ns();
  return Status::ok;
}

void release_stream(int device, int64_t stream, const char* name) {
  if (!valid_device(device)) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  Stream* st = find_stream(s, device, stream);
  if (!st->held_by_me()) return;
  if (--st->held > 0) return;
  s.devices[device].locked_only.fetch_sub(1);
  if (s.tracing && name != nullptr && st->held_since_ns != 0) {
    trace(s, Activity::kernel, name, device, stream, st->held_since_ns, now_ns(), correlation_id);
  }
  st->held_since_ns = 0;
  notify(s);
}

}  // namespace {{ cookiecutter.device }}::driver

namespace {{ cookiecutter.device }}::emulator {

Status run_blocking(int device, int64_t stream, const char* name, const std::function<void()>& work) {
  Status entered = driver::hold_stream(device, stream);
  if (entered != Status::ok) return entered;
  try {
    work();
  } catch (...) {
    driver::release_stream(device, stream, name);
    throw;
  }
  driver::release_stream(device, stream, name);
  return Status::ok;
}

}  // namespace {{ cookiecutter.device }}::emulator

namespace {{ cookiecutter.device }}::driver {

using namespace streams_impl;

Status spin(int device, int64_t stream, int64_t microseconds) {
  Item item;
  item.kind = Item::sleep;
  item.activity = Activity::spin;
  item.name = "sleep";  // what the profiler shows (test_profiler)
  item.us = std::max<int64_t>(microseconds, 0);
  return enqueue(device, stream, std::move(item));
}

}  // namespace {{ cookiecutter.device }}::driver

// driver.h's optional capability graphs: stream capture (enqueue records the work of a capturing
// stream as nodes, and the calls above refuse what would wait for it) and replay (a graph launch
// is one item that runs the nodes in capture order).
namespace {{ cookiecutter.device }}::driver {

using namespace streams_impl;

namespace {

struct Graph {
  int device = 0;
  std::shared_ptr<const std::vector<Node>> nodes;
};

// Runs recorded nodes in their order (on the worker, as one item of the stream the graph runs on).
void run_nodes(const std::vector<Node>& nodes) {
  for (const Node& n : nodes) {
    const Item& item = n.item;
    if (item.kind == Item::sleep) {
      const auto until = Clock::now() + std::chrono::microseconds(item.us);
      while (Clock::now() < until) cpu_relax();
      continue;
    }
    if (item.kind != Item::work || !item.fn) continue;
    try {
      item.fn();
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(item.name != nullptr ? item.name : "?") + ", in a graph: " + e.what());
    }
  }
}

}  // namespace

Status begin_capture(int device, int64_t stream, CaptureMode mode) {
  if (Status ready = usable(device); ready != Status::ok) return ready;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (stream == 0) {
    s.capture_error = "a graph must be captured on a stream other than the default stream";
    return Status::invalid_value;
  }
  Stream* st = find_stream(s, device, stream);
  if (st->capture != nullptr) {
    s.capture_error = "the stream is already capturing a graph";
    return Status::invalid_value;
  }
  auto* c = new Capture();
  c->id = s.next_capture++;
  c->device = device;
  c->origin = st;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->members.push_back(st);
  st->capture = c;
  s.devices[device].captures.push_back(c);
  s.devices[device].locked_only.fetch_add(1);
  return Status::ok;
}

Status end_capture(int device, int64_t stream, void** graph) {
  *graph = nullptr;
  if (!valid_device(device)) return Status::invalid_device;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  Stream* st = find_stream(s, device, stream);
  Capture* c = st->capture;
  if (c == nullptr || c->origin != st) {
    s.capture_error = "the stream is not capturing a graph (end the capture on the stream that began it)";
    return Status::invalid_value;
  }
  bool unjoined = false;
  for (Stream* m : c->members) {
    if (m != st && m->own_last > m->joined) unjoined = true;
    m->capture = nullptr;
    m->own_last = m->joined = 0;
  }
  const auto now = Clock::now();
  for (auto& rec : c->records) {  // points of the graph: nothing outside it waits for them
    rec->done = true;
    rec->when = now;
  }
  auto& list = s.devices[device].captures;
  list.erase(std::remove(list.begin(), list.end(), c), list.end());
  s.devices[device].locked_only.fetch_sub(1);
  notify(s);
  std::unique_ptr<Capture> ended(c);
  if (c->broken) {
    s.capture_error = "the graph capture was invalidated by an operation not permitted while capturing: " + c->why;
    return Status::capture_invalidated;
  }
  if (unjoined) return Status::capture_unjoined;
  auto* g = new Graph();
  g->device = device;
  g->nodes = std::make_shared<const std::vector<Node>>(std::move(c->nodes));
  *graph = g;
  return Status::ok;
}

uint64_t capture_id(int device, int64_t stream) {
  if (!valid_device(device)) return 0;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.devices[device].captures.empty()) return 0;
  const Stream* st = find_stream(s, device, stream);
  return st->capture != nullptr ? st->capture->id : 0;
}

Status graph_instantiate(void* graph, void** exec) {
  if (graph == nullptr) return Status::invalid_value;
  *exec = new Graph(*static_cast<Graph*>(graph));  // shares the nodes: they never change
  return Status::ok;
}

Status graph_launch(void* exec, int device, int64_t stream) {
  if (exec == nullptr) return Status::invalid_value;
  const auto* g = static_cast<Graph*>(exec);
  if (g->device != device) return Status::invalid_device;
  Item item;
  item.name = "graph";
  item.fn = [nodes = g->nodes] { run_nodes(*nodes); };
  return enqueue(device, stream, std::move(item));
}

Status graph_exec_destroy(void* exec) {
  delete static_cast<Graph*>(exec);  // a launch still queued keeps the nodes
  return Status::ok;
}

Status graph_destroy(void* graph) {
  delete static_cast<Graph*>(graph);
  return Status::ok;
}

Status graph_debug_dump(void* graph, const char* path) {
  if (graph == nullptr || path == nullptr) return Status::invalid_value;
  const auto* g = static_cast<Graph*>(graph);
  std::ofstream out(path);
  if (!out) return Status::invalid_value;
  out << "digraph graph_of_device_" << g->device << " {\n  node [shape=box];\n";
  const std::vector<Node>& nodes = *g->nodes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const Item& item = n.item;
    std::string label =
        item.kind == Item::sleep ? "sleep " + std::to_string(item.us) + " us" : (item.name != nullptr ? item.name : "?");
    for (size_t k = 0; (k = label.find('"', k)) != std::string::npos; k += 2) label.insert(k, "\\");
    out << "  n" << i << " [label=\"" << i << ": " << label << "\\nstream " << n.stream << "\"];\n";
    if (i > 0) out << "  n" << (i - 1) << " -> n" << i << ";\n";
  }
  out << "}\n";
  return out ? Status::ok : Status::invalid_value;
}

}  // namespace {{ cookiecutter.device }}::driver

namespace {{ cookiecutter.device }}::emulator {

const char* last_capture_error() {
  thread_local std::string copy;
  std::lock_guard<std::mutex> lock(driver::streams_impl::state().mu);
  copy = driver::streams_impl::state().capture_error;
  return copy.c_str();
}

Status refuse_unsafe_call(int device, const char* what) {
  if (device < 0 || device >= driver::device_count()) return Status::ok;
  auto& s = driver::streams_impl::state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.devices[device].captures.empty()) return Status::ok;
  return driver::streams_impl::refuse_unsafe(s, device, what);
}

}  // namespace {{ cookiecutter.device }}::emulator
