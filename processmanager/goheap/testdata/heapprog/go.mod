// A module of its own: the agreement test builds it with every Go release
// from 1.19 on (utils/gofetch), which refuse a go.mod that names a newer
// one.
module heapprog

go 1.19
