// ThreadPool: work is split over every thread, and a worker that cannot be
// started is a runlm::Error after the started ones are joined (no hang, no
// std::terminate from joinable threads).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <system_error>

#include "common.h"
#include "thread_pool.h"

using namespace runlm;

TEST(ThreadPool, ParallelForCoversTheRange) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, FailedThreadStartIsAnErrorAndJoinsTheStartedOnes) {
  // The spawn seam starts three workers, then fails as pthread_create does
  // at a thread or memory limit (EAGAIN).
  std::atomic<int> started{0}, finished{0};
  const ThreadPool::SpawnFn spawn = [&](std::function<void()> body) {
    if (started.load() == 3) throw std::system_error(EAGAIN, std::generic_category(), "cannot create thread");
    ++started;
    return std::thread([body, &finished] {
      body();
      ++finished;
    });
  };
  // Run on another thread with a deadline: the old constructor never returned.
  auto result = std::async(std::launch::async, [&] {
    try {
      ThreadPool pool(8, spawn);
      return std::string("no error");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  });
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "ThreadPool hung";
  const std::string msg = result.get();
  EXPECT_NE(msg.find("cannot start 8 CPU threads"), std::string::npos) << msg;
  EXPECT_NE(msg.find("thread 4 failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("-t"), std::string::npos) << msg;
  EXPECT_EQ(started.load(), 3);
  EXPECT_EQ(finished.load(), 3);  // every started worker ran to its end and was joined
}

TEST(ThreadPool, FailedFirstThreadIsAnErrorToo) {
  const ThreadPool::SpawnFn spawn = [](std::function<void()>) -> std::thread {
    throw std::system_error(EAGAIN, std::generic_category(), "cannot create thread");
  };
  EXPECT_THROW(ThreadPool(2, spawn), Error);
  // One thread needs no worker: the seam is never called.
  ThreadPool single(1, spawn);
  int sum = 0;
  single.parallel_for(10, [&](int64_t b, int64_t e, int) { sum += static_cast<int>(e - b); });
  EXPECT_EQ(sum, 10);
}
