package process

import (
	"strings"
	"testing"
)

func TestContainerFromCgroup(t *testing.T) {
	const id = "3f4e8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7"
	const id2 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const pod = "1b7c8f4e-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
	const staticPod = "8d2c1e0f9a8b7c6d5e4f3a2b1c0d9e8f"
	tests := []struct {
		name, cgroup, want, wantPod string
	}{
		{"no container v2", "0::/user.slice/user-1000.slice/session-2.scope\n", "", ""},
		{"no container v1", "12:cpuset:/\n11:memory:/user.slice\n0::/\n", "", ""},
		{"docker v1 cgroupfs", "12:cpuset:/docker/" + id + "\n11:memory:/docker/" + id + "\n", id, ""},
		{"docker v2 systemd", "0::/system.slice/docker-" + id + ".scope\n", id, ""},
		{"kubepods v1 cgroupfs", "11:memory:/kubepods/burstable/pod" + pod + "/" + id + "\n", id, pod},
		{"kubepods v1 cgroupfs guaranteed", "11:memory:/kubepods/pod" + pod + "/" + id + "\n", id, pod},
		{"kubepods v2 cgroupfs cri-o", "0::/kubepods/besteffort/pod" + pod + "/crio-" + id + "\n", id, pod},
		{"kubepods v2 containerd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b7c8f4e_2a3d_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-" + id + ".scope\n", id, pod},
		{"kubepods v2 guaranteed", "0::/kubepods.slice/kubepods-pod1b7c8f4e_2a3d_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-" + id + ".scope\n", id, pod},
		{"kubepods v2 docker", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b7c8f4e_2a3d_4e5f_8a9b_0c1d2e3f4a5b.slice/docker-" + id + ".scope\n", id, pod},
		{"kubepods v2 static pod", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + staticPod + ".slice/cri-containerd-" + id + ".scope\n", id, staticPod},
		{"kubepods v2 cri-o", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice/crio-" + id + ".scope\n", id, ""},
		{"pod without container", "0::/kubepods.slice/kubepods-pod1b7c8f4e_2a3d_4e5f_8a9b_0c1d2e3f4a5b.slice\n", "", pod},
		{"pod-like name outside kubepods", "0::/system.slice/x-pod1b7c8f4e_2a3d_4e5f_8a9b_0c1d2e3f4a5b.slice\n", "", ""},
		{"pod uid in upper case", "0::/kubepods/pod" + strings.ToUpper(pod) + "/" + id + "\n", id, ""},
		{"cri-o conmon is not the container", "0::/kubepods.slice/kubepods-pod12.slice/crio-conmon-" + id + ".scope\n", "", ""},
		{"podman v2", "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + id + ".scope/container\n", id, ""},
		{"podman v1", "1:name=systemd:/libpod_parent/libpod-" + id + "\n", id, ""},
		{"containerd plain", "0::/system.slice/containerd.service/containerd-" + id + ".scope\n", id, ""},
		{"nested docker takes innermost", "0::/docker/" + id + "/docker/" + id2 + "\n", id2, ""},
		{"v1 and v2 lines, first match", "4:memory:/process_api/6f88efc7159424edd76dee16368d10b4\n0::/docker/" + id + "\n", id, ""},
		{"short hex is not an id", "0::/docker/6f88efc71594\n", "", ""},
		{"uppercase hex is not an id", "0::/docker/" + strings.ToUpper(id) + "\n", "", ""},
		{"malformed lines", "garbage\n:\n", "", ""},
		{"colon in path", "0::/weird:path/docker-" + id + ".scope\n", id, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, gotPod := containerFromCgroup(strings.NewReader(tt.cgroup))
			if got != tt.want || gotPod != tt.wantPod {
				t.Errorf("containerFromCgroup = %q, %q; want %q, %q", got, gotPod, tt.want, tt.wantPod)
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, stat string
		want       Stat
		wantErr    bool
	}{
		{
			name: "plain",
			stat: "1234 (cat) R 1 1234 1 34816 1234 4194304 96 0 0 0 7 5 0 0 20 0 1 0 5567 5713920 256 18446744073709551615\n",
			want: Stat{State: 'R', StartTime: 5567, CPUTicks: 12},
		},
		{
			name: "comm with spaces and parens",
			stat: "99 (a b) c) Z 1 99 1 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0 18446744073709551615\n",
			want: Stat{State: 'Z', StartTime: 777},
		},
		{name: "truncated", stat: "1 (x) S 1 1", wantErr: true},
		{name: "no comm", stat: "1 x S", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.stat))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want && !tt.wantErr {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzContainerFromCgroup(f *testing.F) {
	f.Add("0::/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n")
	f.Add("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b7c8f4e_2a3d_4e5f_8a9b_0c1d2e3f4a5b.slice/" +
		"cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n")
	f.Add("11:memory:/kubepods/burstable/pod1b7c8f4e-2a3d-4e5f-8a9b-0c1d2e3f4a5b/crio-abc\n")
	f.Fuzz(func(t *testing.T, s string) {
		id, pod := containerFromCgroup(strings.NewReader(s))
		if (id != "" && !isHexID(id)) || (pod != "" && !isPodUID(pod)) {
			t.Errorf("returned %q, %q", id, pod)
		}
	})
}
