// A module of its own: the Go label tests build this workload with every
// Go release from 1.19 on (utils/gofetch), which refuse a go.mod that
// names a newer one.
module golabels

go 1.19
