package e2e

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// dockerStage is one FROM ... stage of a Dockerfile: its name and its
// instructions, each as (keyword, arguments) with continuations joined.
type dockerStage struct {
	name   string
	instrs [][2]string
}

// parseDockerfile splits a Dockerfile into stages. It knows only the plain
// syntax our Dockerfile uses: comments, continuation lines, one
// instruction per line.
func parseDockerfile(text string) []dockerStage {
	var stages []dockerStage
	var logical strings.Builder
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && logical.Len() == 0) {
			continue
		}
		if cont, ok := strings.CutSuffix(trimmed, "\\"); ok {
			logical.WriteString(cont + " ")
			continue
		}
		logical.WriteString(trimmed)
		keyword, args, _ := strings.Cut(strings.TrimSpace(logical.String()), " ")
		logical.Reset()
		keyword = strings.ToUpper(keyword)
		if keyword == "FROM" {
			name := ""
			if f := strings.Fields(args); len(f) >= 3 && strings.EqualFold(f[len(f)-2], "AS") {
				name = f[len(f)-1]
			}
			stages = append(stages, dockerStage{name: name})
		}
		if len(stages) > 0 {
			stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, [2]string{keyword, strings.TrimSpace(args)})
		}
	}
	return stages
}

// TestDockerfileBuildSteps runs the Dockerfile's builder stage outside
// Docker, in a clone of the repository standing in for the build context,
// and checks the file the runtime stage copies: the static binary `make
// build` makes, naming this commit and the committed BPF object.
func TestDockerfileBuildSteps(t *testing.T) {
	requireE2E(t)
	requireRoot(t) // apt-get
	root := repoRoot(t)
	text, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(text))
	if len(stages) != 2 || stages[0].name != "builder" {
		t.Fatalf("want a builder stage and a runtime stage, got %+v", stages)
	}
	ctxDir := filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command("git", "clone", "-q", root, ctxDir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}

	// Docker's automatic platform arguments, for this machine.
	env := append(os.Environ(), "TARGETARCH="+runtime.GOARCH, "BUILDPLATFORM=linux/"+runtime.GOARCH)
	workdir := ""
	for _, in := range stages[0].instrs {
		switch keyword, args := in[0], in[1]; keyword {
		case "FROM", "ARG":
			if k, v, ok := strings.Cut(args, "="); ok {
				env = append(env, k+"="+v)
			}
		case "ENV":
			env = append(env, args)
		case "WORKDIR":
			workdir = args
		case "COPY":
			// The clone is the build context and the work dir at once;
			// check the sources exist.
			f := strings.Fields(args)
			for _, src := range f[:len(f)-1] {
				if _, err := os.Stat(filepath.Join(ctxDir, src)); err != nil {
					t.Errorf("COPY %s: %v", args, err)
				}
			}
		case "RUN":
			t.Logf("RUN %s", args)
			cmd := exec.Command("sh", "-c", args)
			cmd.Dir, cmd.Env = ctxDir, env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("RUN %s: %v\n%s", args, err, out)
			}
		default:
			t.Fatalf("the test does not know %s: keep the builder to FROM, ARG, ENV, WORKDIR, COPY, RUN", keyword)
		}
	}

	var copied, dest, entrypoint string
	for _, in := range stages[1].instrs {
		switch in[0] {
		case "COPY":
			f := strings.Fields(in[1])
			if len(f) != 3 || f[0] != "--from=builder" {
				t.Fatalf("runtime stage: COPY %s, want COPY --from=builder SRC DST", in[1])
			}
			copied, dest = f[1], f[2]
		case "ENTRYPOINT":
			entrypoint = in[1]
		}
	}
	if entrypoint != `["`+dest+`"]` {
		t.Errorf("ENTRYPOINT %s does not run the copied %s", entrypoint, dest)
	}
	rel, ok := strings.CutPrefix(copied, workdir+"/")
	if !ok {
		t.Fatalf("the runtime stage copies %s, outside the builder's WORKDIR %s", copied, workdir)
	}
	bin := filepath.Join(ctxDir, rel)
	checkImageBinary(t, bin, ctxDir)

	// The repository's own `make build` must give the same bytes when it
	// builds the same commit from a clean tree (as CI's clean clone does).
	head, _ := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	status, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output()
	ours, err := os.ReadFile(profilerBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	image, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(status) > 0 {
		t.Logf("the repository has uncommitted changes: not comparing with its binary")
	} else if !bytes.Equal(ours, image) {
		t.Errorf("the image's binary differs from %s (make build at %s)", profilerBinary(t), strings.TrimSpace(string(head)))
	}
}

// checkImageBinary checks bin is static (the runtime image has no libc)
// and that -version names the commit of src and the BPF object committed
// there.
func checkImageBinary(t *testing.T, bin, src string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an ELF interpreter: not static, it will not run in the runtime image", bin)
		}
	}
	out, err := exec.Command(bin, "-version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -version: %v\n%s", bin, err, out)
	}
	commit, err := exec.Command("git", "-C", src, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	obj, err := os.ReadFile(filepath.Join(src, "support", "ebpf", "tracer.ebpf."+runtime.GOARCH+".o"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(obj)
	for _, want := range []string{"commit " + strings.TrimSpace(string(commit)), "sha256:" + hex.EncodeToString(sum[:])} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-version printed %q, want it to contain %q", out, want)
		}
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}
