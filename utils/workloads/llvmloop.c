// Spends its time in a large library: LLVM (libLLVM-16.so.1, ~120 MB, about
// a million stack deltas), through its C API, dlopen()ed so that no LLVM
// headers are needed. It builds a module with a function of many
// instructions over and over: main → ll_top → LLVM… for the seconds given
// as its argument. Built -O2 without frame pointers: its stacks are complete
// only once the deltas of this program, libc and libLLVM are loaded.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void *ref;

static ref (*context_create)(void);
static void (*context_dispose)(ref);
static ref (*module_create)(const char *, ref);
static void (*module_dispose)(ref);
static ref (*int32_type)(ref);
static ref (*function_type)(ref, ref *, unsigned, int);
static ref (*add_function)(ref, const char *, ref);
static ref (*append_block)(ref, ref, const char *);
static ref (*builder_create)(ref);
static void (*builder_dispose)(ref);
static void (*position_at_end)(ref, ref);
static ref (*get_param)(ref, unsigned);
static ref (*build_add)(ref, ref, ref, const char *);
static ref (*build_mul)(ref, ref, ref, const char *);
static ref (*build_ret)(ref, ref);

static void *must(void *lib, const char *name)
{
  void *f = dlsym(lib, name);
  if (!f) {
    fprintf(stderr, "llvmloop: %s: %s\n", name, dlerror());
    exit(1);
  }
  return f;
}

__attribute__((noinline)) static void ll_top(void)
{
  ref ctx = context_create();
  ref mod = module_create("m", ctx);
  ref i32 = int32_type(ctx);
  ref params[2] = {i32, i32};
  ref fn = add_function(mod, "f", function_type(i32, params, 2, 0));
  ref b = builder_create(ctx);
  position_at_end(b, append_block(ctx, fn, "entry"));
  ref v = get_param(fn, 0), w = get_param(fn, 1);
  for (int i = 0; i < 400; i++) {
    v = build_add(b, v, w, "a");
    w = build_mul(b, v, w, "m");
  }
  build_ret(b, v);
  builder_dispose(b);
  module_dispose(mod);
  context_dispose(ctx);
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  const char *path = argc > 2 ? argv[2] : "libLLVM-16.so.1";
  void *lib = dlopen(path, RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "llvmloop: %s\n", dlerror());
    return 1;
  }
  context_create = must(lib, "LLVMContextCreate");
  context_dispose = must(lib, "LLVMContextDispose");
  module_create = must(lib, "LLVMModuleCreateWithNameInContext");
  module_dispose = must(lib, "LLVMDisposeModule");
  int32_type = must(lib, "LLVMInt32TypeInContext");
  function_type = must(lib, "LLVMFunctionType");
  add_function = must(lib, "LLVMAddFunction");
  append_block = must(lib, "LLVMAppendBasicBlockInContext");
  builder_create = must(lib, "LLVMCreateBuilderInContext");
  builder_dispose = must(lib, "LLVMDisposeBuilder");
  position_at_end = must(lib, "LLVMPositionBuilderAtEnd");
  get_param = must(lib, "LLVMGetParam");
  build_add = must(lib, "LLVMBuildAdd");
  build_mul = must(lib, "LLVMBuildMul");
  build_ret = must(lib, "LLVMBuildRet");

  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  do {
    ll_top();
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  return 0;
}
