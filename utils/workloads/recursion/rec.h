// Shared by the recursion workload's executable and library.
#pragma once

extern "C" {
void rec_exe(int depth);
void rec_lib(int depth);
void rec_leaf();
}
