// The test application of the correlation tests: it dlopens the test agent
// (agent.c), opens the agent's socket, publishes the process storage and
// runs two threads in two transactions while burning CPU, switching
// transactions every 500 ms; a third thread records every message the
// profiler sends. Everything goes to stdout as lines:
//   loaded NS                                                  (agent dlopened)
//   published NS                                               (storage published)
//   tx TID TRACE_ID TRANSACTION_ID SPAN_ID START_NS END_NS   (CLOCK_REALTIME)
//   idle TID START_NS END_NS                                   (no trace active)
//   msg NS HEX                                                 (a datagram)
// Usage: app [-l LOAD_AFTER_S] [-p PUBLISH_AFTER_S] [-P PUBLISHED_PATH] [-a]
//            AGENT_SO SOCKET_PATH SECONDS
//   -l  burn CPU this long before loading the agent (the profiler then
//       knows the process before the library appears)
//   -p  wait this long after loading before publishing the storage
//   -P  publish this socket path instead of SOCKET_PATH (still bound)
//   -a  publish a storage whose service name claims 4 GiB
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int (*publish)(const char *, const char *, const char *);
static int (*publish_absurd)(void);
static int (*thread_init)(void);
static void (*set_trace)(int, const uint8_t *, const uint8_t *, const uint8_t *, uint8_t);

static double seconds;
static int sock;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void hex(char *dst, const uint8_t *b, int n)
{
  for (int i = 0; i < n; i++)
    sprintf(dst + 2 * i, "%02x", b[i]);
}

volatile unsigned long sink;

// Each worker burns CPU in its own function, so its stacks are its own.
__attribute__((noinline)) void burn_a(uint64_t until)
{
  while (now_ns() < until)
    for (int i = 0; i < 10000; i++)
      sink += i;
}

__attribute__((noinline)) void burn_b(uint64_t until)
{
  while (now_ns() < until)
    for (int i = 0; i < 10000; i++)
      sink += i;
}

static void *worker(void *arg)
{
  long id = (long)arg;
  thread_init();
  uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
  pid_t tid = syscall(SYS_gettid);
  for (int round = 0; now_ns() < end; round++) {
    uint8_t trace[16], span[8], tx[8];
    for (int i = 0; i < 16; i++)
      trace[i] = (uint8_t)(0x10 * (id + 1) + round + i);
    for (int i = 0; i < 8; i++) {
      tx[i] = (uint8_t)(0xa0 + 0x10 * id + round + i);
      span[i] = (uint8_t)(0x50 + 0x10 * id + round + i);
    }
    // 100 ms outside any trace, then 400 ms in one.
    uint64_t t0 = now_ns();
    set_trace(0, 0, 0, 0, 0);
    (id ? burn_b : burn_a)(t0 + 100000000);
    uint64_t t1 = now_ns();
    set_trace(1, trace, span, tx, 1);
    (id ? burn_b : burn_a)(t1 + 400000000);
    uint64_t t2 = now_ns();
    char th[33], sh[17], xh[17];
    hex(th, trace, 16);
    hex(sh, span, 8);
    hex(xh, tx, 8);
    pthread_mutex_lock(&out);
    printf("idle %d %llu %llu\n", tid, (unsigned long long)t0, (unsigned long long)t1);
    printf("tx %d %s %s %s %llu %llu\n", tid, th, xh, sh, (unsigned long long)t1,
           (unsigned long long)t2);
    fflush(stdout);
    pthread_mutex_unlock(&out);
  }
  set_trace(0, 0, 0, 0, 0);
  return 0;
}

static void *receiver(void *arg)
{
  (void)arg;
  uint8_t buf[65536];
  char line[2 * sizeof(buf) + 1];
  for (;;) {
    ssize_t n = recv(sock, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        usleep(1000);
        continue;
      }
      return 0;
    }
    hex(line, buf, n);
    pthread_mutex_lock(&out);
    printf("msg %llu %s\n", (unsigned long long)now_ns(), line);
    fflush(stdout);
    pthread_mutex_unlock(&out);
  }
}

static void print_time(const char *what)
{
  pthread_mutex_lock(&out);
  printf("%s %llu\n", what, (unsigned long long)now_ns());
  fflush(stdout);
  pthread_mutex_unlock(&out);
}

int main(int argc, char **argv)
{
  double load_after = 0, publish_after = 0;
  const char *published = 0;
  int absurd = 0, opt;
  while ((opt = getopt(argc, argv, "l:p:P:a")) != -1) {
    switch (opt) {
    case 'l':
      load_after = atof(optarg);
      break;
    case 'p':
      publish_after = atof(optarg);
      break;
    case 'P':
      published = optarg;
      break;
    case 'a':
      absurd = 1;
      break;
    default:
      return 2;
    }
  }
  if (argc - optind != 3) {
    fprintf(stderr,
            "usage: %s [-l S] [-p S] [-P PUBLISHED_PATH] [-a] AGENT_SO SOCKET_PATH SECONDS\n",
            argv[0]);
    return 2;
  }
  const char *agent_so = argv[optind], *path = argv[optind + 1];
  seconds = atof(argv[optind + 2]);
  if (load_after > 0)
    burn_a(now_ns() + (uint64_t)(load_after * 1e9));
  void *agent = dlopen(agent_so, RTLD_NOW);
  if (!agent) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  publish = dlsym(agent, "agent_publish_process_storage");
  publish_absurd = dlsym(agent, "agent_publish_absurd_storage");
  thread_init = dlsym(agent, "agent_thread_init");
  set_trace = dlsym(agent, "agent_set_trace");
  if (!publish || !publish_absurd || !thread_init || !set_trace) {
    fprintf(stderr, "agent lacks its functions\n");
    return 1;
  }
  print_time("loaded");
  sock = socket(AF_UNIX, SOCK_DGRAM, 0);
  fcntl(sock, F_SETFL, fcntl(sock, F_GETFL, 0) | O_NONBLOCK);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
  unlink(path);
  if (bind(sock, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
    perror("bind");
    return 1;
  }
  pthread_t w[2], r;
  pthread_create(&r, 0, receiver, 0);
  for (long i = 0; i < 2; i++)
    pthread_create(&w[i], 0, worker, (void *)i);
  if (publish_after > 0)
    usleep((useconds_t)(publish_after * 1e6));
  // The storage names the socket only once it exists (spec).
  if (absurd)
    publish_absurd();
  else
    publish("testagent-svc", "test-env", published ? published : path);
  print_time("published");
  for (int i = 0; i < 2; i++)
    pthread_join(w[i], 0);
  usleep(1500000); // the last correlation messages
  unlink(path);
  return 0;
}
