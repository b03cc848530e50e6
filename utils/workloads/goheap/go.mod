// A module of its own: the heap profile tests build this workload with
// other Go releases (utils/gofetch), which refuse a go.mod that names a
// newer one.
module goheap

go 1.19
