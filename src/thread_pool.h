// A small persistent thread pool for the CPU backend: parallel_for splits a
// range into one contiguous chunk per thread and waits for all of them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace runlm {

class ThreadPool {
 public:
  // Starts a worker thread: std::thread by default. Tests pass one that
  // fails, to check that a failed start is an Error and not a hang.
  using SpawnFn = std::function<std::thread(std::function<void()>)>;
  static std::thread spawn_std_thread(std::function<void()> body);

  // n_threads <= 0 means one per hardware thread. When a worker cannot be
  // started (thread limit, memory limit), the ones already started are
  // stopped and joined and an Error says how many started.
  explicit ThreadPool(int n_threads, const SpawnFn& spawn = spawn_std_thread);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Calls fn(begin, end, thread_index) over [0, n) split into chunks; the
  // calling thread takes chunk 0. Returns when every chunk is done.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker(int index);
  void stop_workers();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace runlm
