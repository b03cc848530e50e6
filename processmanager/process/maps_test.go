package process

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMapsLine(t *testing.T) {
	tests := []struct {
		name, line string
		want       MapsEntry
		wantErr    bool
	}{
		{
			name: "executable file",
			line: "7fd5ae438000-7fd5ae58e000 r-xp 00026000 fe:00 326269                     /usr/lib/x86_64-linux-gnu/libc.so.6",
			want: MapsEntry{Start: 0x7fd5ae438000, End: 0x7fd5ae58e000, Offset: 0x26000,
				Dev: unix.Mkdev(0xfe, 0), Inode: 326269, Path: "/usr/lib/x86_64-linux-gnu/libc.so.6", Executable: true},
		},
		{
			name: "path with spaces",
			line: "00400000-00401000 r-xp 00001000 08:01 42        /opt/my app/bin  x",
			want: MapsEntry{Start: 0x400000, End: 0x401000, Offset: 0x1000,
				Dev: unix.Mkdev(8, 1), Inode: 42, Path: "/opt/my app/bin  x", Executable: true},
		},
		{
			name: "deleted file",
			line: "00400000-00401000 r-xp 00000000 103:02 77 /tmp/a.out (deleted)",
			want: MapsEntry{Start: 0x400000, End: 0x401000,
				Dev: unix.Mkdev(0x103, 2), Inode: 77, Path: "/tmp/a.out", Deleted: true, Executable: true},
		},
		{
			name: "vdso",
			line: "7ffd3b5f4000-7ffd3b5f6000 r-xp 00000000 00:00 0                          [vdso]",
			want: MapsEntry{Start: 0x7ffd3b5f4000, End: 0x7ffd3b5f6000, Path: "[vdso]", Executable: true},
		},
		{
			name: "anonymous with trailing space",
			line: "7fd5ae2eb000-7fd5ae3af000 rw-p 00000000 00:00 0 ",
			want: MapsEntry{Start: 0x7fd5ae2eb000, End: 0x7fd5ae3af000},
		},
		{
			name: "anonymous without trailing space",
			line: "7fd5ae2eb000-7fd5ae3af000 rwxp 00000000 00:00 0",
			want: MapsEntry{Start: 0x7fd5ae2eb000, End: 0x7fd5ae3af000, Executable: true},
		},
		{
			name: "deleted suffix on anonymous memory is kept",
			line: "7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [anon:x] (deleted)",
			want: MapsEntry{Start: 0x7f0000000000, End: 0x7f0000001000, Path: "[anon:x] (deleted)", Executable: true},
		},
		{
			name: "inaccessible reserve",
			line: "7f1000003000-7f1008000000 ---p 00000000 00:00 0 ",
			want: MapsEntry{Start: 0x7f1000003000, End: 0x7f1008000000, Inaccessible: true},
		},
		{name: "empty", line: "", wantErr: true},
		{name: "no dash", line: "7f00 r-xp 00000000 00:00 0", wantErr: true},
		{name: "bad hex", line: "zz-7f00 r-xp 00000000 00:00 0", wantErr: true},
		{name: "end before start", line: "2000-1000 r-xp 00000000 00:00 0", wantErr: true},
		{name: "short perms", line: "1000-2000 r-x 00000000 00:00 0", wantErr: true},
		{name: "bad device", line: "1000-2000 r-xp 00000000 0000 0", wantErr: true},
		{name: "bad inode", line: "1000-2000 r-xp 00000000 00:00 x", wantErr: true},
		{name: "truncated", line: "1000-2000 r-xp", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMapsLine(tt.line)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseMapsKeepsExecutable(t *testing.T) {
	maps := `5632ee97f000-5632ee981000 r--p 00000000 fe:00 247026                     /usr/bin/cat
5632ee981000-5632ee986000 r-xp 00002000 fe:00 247026                     /usr/bin/cat
563302a20000-563302a41000 rw-p 00000000 00:00 0                          [heap]
7fd5ae2eb000-7fd5ae3af000 rw-p 00000000 00:00 0 
7ffd3b5f4000-7ffd3b5f6000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
`
	got, err := parseMaps(strings.NewReader(maps), ExecutableMappings)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range got {
		paths = append(paths, e.Path)
	}
	if want := "/usr/bin/cat [vdso] [vsyscall]"; strings.Join(paths, " ") != want {
		t.Errorf("kept %q, want %q", paths, want)
	}
	if all, err := parseMaps(strings.NewReader(maps), AllMappings); err != nil || len(all) != 6 {
		t.Errorf("all mappings: %d, %v; want 6", len(all), err)
	}
}

func FuzzParseMapsLine(f *testing.F) {
	f.Add("7fd5ae438000-7fd5ae58e000 r-xp 00026000 fe:00 326269  /usr/lib/libc.so.6 (deleted)")
	f.Add("1000-2000 r-xp 00000000 00:00 0 ")
	f.Fuzz(func(t *testing.T, line string) {
		e, err := parseMapsLine(line)
		if err == nil && e.End < e.Start {
			t.Errorf("accepted end < start: %+v", e)
		}
	})
}
