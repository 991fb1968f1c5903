// Faults runlm must survive: Ctrl-C in chat stops the reply only, a
// failed write on stdout is an error with a non-zero exit (not a silent
// success), and running out of host memory at load is a clear message.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

using namespace runlm::test;

namespace {

using Clock = std::chrono::steady_clock;

// True in a build with AddressSanitizer (GCC or clang): it reserves terabytes
// of address space for its shadow, so address-space limits cannot be tested.
constexpr bool kAsan =
#if defined(__SANITIZE_ADDRESS__)
    true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    true;
#else
    false;
#endif
#else
    false;
#endif

// A child process with stdin and stdout on pipes and stderr in a file.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) : err_(".err") {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      const int e = open(err_.str().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(e, STDERR_FILENO);
      close(in[0]), close(in[1]), close(out[0]), close(out[1]), close(e);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    in_ = in[1];
    out_ = out[0];
    fcntl(out_, F_SETFL, O_NONBLOCK);
  }
  ~Child() {
    if (in_ >= 0) close(in_);
    close(out_);
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  void write_line(const std::string& s) {
    const std::string line = s + "\n";
    ASSERT_EQ(write(in_, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  }
  void close_stdin() {
    close(in_);
    in_ = -1;
  }
  // Reads whatever stdout holds now, without waiting; false at EOF.
  bool drain() {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(out_, buf, sizeof buf);
      if (n > 0) out.append(buf, static_cast<size_t>(n));
      else return n != 0;  // -1 with EAGAIN: nothing more for now
    }
  }
  // Reads stdout, waiting up to `timeout` for at least `min_new` new bytes.
  bool read_until(size_t min_new, std::chrono::milliseconds timeout) {
    const size_t start = out.size();
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const bool open = drain();
      if (out.size() >= start + min_new) return true;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (!open || left <= 0) return false;
      pollfd p{out_, POLLIN, 0};
      poll(&p, 1, static_cast<int>(left));
    }
  }
  void signal(int sig) { kill(pid_, sig); }
  // Waits for the exit (draining stdout); false on timeout.
  bool wait(std::chrono::seconds timeout, int* status) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      drain();
      if (waitpid(pid_, status, WNOHANG) == pid_) {
        reaped_ = true;
        drain();
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  std::string err() const { return read_file(err_.str()); }

  std::string out;

 private:
  TempPath err_;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  bool reaped_ = false;
};

}  // namespace

TEST(Faults, SigintInChatStopsTheReplyOnly) {
  // stories260K does not end a reply to this prompt at temperature 0 before
  // the context fills (minutes at 32768 tokens), so each reply is still
  // running when its SIGINT comes; its first bytes tell us it has started.
  Child chat({runlm_binary(), "chat", "-m", shared_model("stories260K.gguf"), "--chat-template", "llama2", "-n",
              "100000", "-c", "32768", "--temp", "0", "-t", "1"});
  const auto stopped = [&](size_t n) {
    // The notice goes to stderr after the reply's last bytes and newline.
    for (int i = 0; i < 3000; ++i) {
      const std::string err = chat.err();
      size_t count = 0;
      for (size_t at = err.find("(reply stopped)"); at != std::string::npos; at = err.find("(reply stopped)", at + 1))
        ++count;
      chat.drain();  // stdout got the reply's bytes before stderr got the notice
      if (count >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  chat.write_line("Tell me a very long story about a dog and a cat.");
  ASSERT_TRUE(chat.read_until(1, std::chrono::seconds(120))) << "no reply started\n" << chat.err();
  chat.signal(SIGINT);
  ASSERT_TRUE(stopped(1)) << "the first reply did not stop\n" << chat.err();
  const size_t after_first = chat.out.size();
  // The program is still there: the next line gets a reply of its own,
  // stopped the same way.
  chat.write_line("Now tell me another one.");
  ASSERT_TRUE(chat.read_until(1, std::chrono::seconds(120))) << "no second reply\n" << chat.err();
  chat.signal(SIGINT);
  ASSERT_TRUE(stopped(2)) << "the second reply did not stop\n" << chat.err();
  chat.write_line("/exit");
  chat.close_stdin();
  int status = 0;
  ASSERT_TRUE(chat.wait(std::chrono::seconds(60), &status)) << "chat did not exit\n" << chat.err();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << "\n"
                                 << chat.err();
  EXPECT_EQ(WEXITSTATUS(status), 0) << chat.err();
  const std::string err = chat.err();
  EXPECT_EQ(err.find("error"), std::string::npos) << err;
  // Each reply was written and ended with its newline.
  ASSERT_GT(after_first, 1u);
  EXPECT_EQ(chat.out[after_first - 1], '\n');
  EXPECT_GT(chat.out.size(), after_first + 1);
  EXPECT_EQ(chat.out.back(), '\n');
}

TEST(Faults, WriteErrorOnStdoutIsAnErrorNotASilentSuccess) {
  struct stat st;
  if (stat("/dev/full", &st) != 0) GTEST_SKIP() << "no /dev/full on this system";
  TempPath err(".err");
  const std::string cmd = runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                          " -t 1 -p 'Once upon a time' -n 16 --temp 0 > /dev/full 2> " + err.str();
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "crashed: " << read_file(err.str());
  EXPECT_EQ(WEXITSTATUS(status), 1) << read_file(err.str());
  const std::string msg = read_file(err.str());
  EXPECT_NE(msg.find("error: writing to stdout failed: No space left on device"), std::string::npos) << msg;
}

TEST(Faults, OutOfHostMemoryAtLoadIsAClearMessage) {
  if (kAsan) GTEST_SKIP() << "AddressSanitizer cannot run under an address-space limit";
  // 1.5 GB of address space: enough to start and map the model, not for a
  // 2e6-token KV cache (1280 bytes per token: 2.56 GB), which still fits the
  // machine's memory, so only the allocation itself can fail.
  const CommandResult r = run_command("ulimit -v 1500000 && " + runlm_binary() + " generate -m " +
                                      shared_model("stories260K.gguf") + " -t 1 -c 2000000 -p hi -n 1 --temp 0");
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("memory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("KV cache"), std::string::npos) << r.err;
}
