// embed.c - a small C program that embeds LuaJIT through libluajit-5.1.so.2 (Debian's
// libluajit-5.1-2), the "LuaJIT inside a host program" case of the profiler's LuaJIT tests.
// fetch-luajit.sh compiles it against the fetched headers and library.
//
// Usage: luajit-embed SCRIPT [ARG...]: runs SCRIPT with the standard libraries open, arg set
// as the luajit command sets it, and one extra global, embed_burn(n), a lua_CFunction that
// spins n iterations in C (a classic C API frame between Lua frames, unlike an FFI call).
#include <stdio.h>
#include <stdlib.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

// embed_burn spins in C; noinline keeps it one native frame of its own.
__attribute__((noinline)) static int embed_burn(lua_State *L)
{
  volatile unsigned long acc = 0;
  lua_Number n = luaL_checknumber(L, 1);
  for (lua_Number i = 0; i < n; i++)
    acc += (unsigned long)i ^ (acc >> 3);
  lua_pushnumber(L, (lua_Number)(acc & 0xffff));
  return 1;
}

__attribute__((noinline)) static int run_script(lua_State *L, int argc, char **argv)
{
  lua_createtable(L, argc, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - 1);
  }
  lua_setglobal(L, "arg");
  if (luaL_loadfile(L, argv[1]) != 0)
    return 1;
  return lua_pcall(L, 0, 0, 0);
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRIPT [ARG...]\n", argv[0]);
    return 2;
  }
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "luaL_newstate failed\n");
    return 1;
  }
  luaL_openlibs(L);
  lua_register(L, "embed_burn", embed_burn);
  int rc = run_script(L, argc, argv);
  if (rc != 0)
    fprintf(stderr, "%s: %s\n", argv[1], lua_tostring(L, -1));
  lua_close(L);
  return rc == 0 ? 0 : 1;
}
