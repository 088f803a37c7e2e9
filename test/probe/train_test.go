package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpurack/gpurack/internal/testreq"
)

// train runs probe train and returns its output and error.
func train(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(append([]string{"train"}, args...), &out, filepath.Join(t.TempDir(), "termination-log"))
	return out.String(), err
}

var epochLineRE = regexp.MustCompile(`(?m)^epoch (\d+)/\d+ loss ([0-9.]+) accuracy ([0-9.]+) \(CPU\), checkpoint saved$`)

// TestTrainResumes: a run of 2 epochs, then a run to 5 goes on from epoch 2's
// checkpoint (epochs 3 to 5, never 1 again), the loss falls and the accuracy ends
// above chance; both runs say CUDA is unavailable and they computed on the CPU.
func TestTrainResumes(t *testing.T) {
	dir := t.TempDir()
	first, err := train(t, dir, "2")
	if err != nil {
		t.Fatalf("first run: %v\n%s", err, first)
	}
	second, err := train(t, dir, "5")
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, second)
	}
	for _, out := range []string{first, second} {
		if !strings.Contains(out, "CUDA: unavailable") || !strings.Contains(out, "computed on the CPU") {
			t.Errorf("the run does not say it computed on the CPU, CUDA unavailable:\n%s", out)
		}
	}
	if !strings.Contains(first, "no checkpoint in "+dir+": starting at epoch 1") || !strings.Contains(second, "resumed from the checkpoint of epoch 2") {
		t.Errorf("first run:\n%s\nsecond run:\n%s\nwant a fresh start, then a resume from epoch 2", first, second)
	}
	var epochs []int
	var losses []float64
	for _, m := range epochLineRE.FindAllStringSubmatch(first+second, -1) {
		e, _ := strconv.Atoi(m[1])
		l, _ := strconv.ParseFloat(m[2], 64)
		epochs, losses = append(epochs, e), append(losses, l)
	}
	if want := []int{1, 2, 3, 4, 5}; !slices.Equal(epochs, want) {
		t.Fatalf("epochs %v across both runs; want %v", epochs, want)
	}
	for i := 1; i < len(losses); i++ {
		if losses[i] >= losses[i-1] {
			t.Errorf("loss did not fall from epoch %d to %d: %v", i, i+1, losses)
		}
	}
	ck, err := loadCheckpoint(dir)
	if err != nil || ck == nil || ck.Epoch != 5 || ck.Accuracy < 0.8 {
		t.Errorf("checkpoint after 5 epochs: %+v, %v; want epoch 5, accuracy above 0.8", ck, err)
	}
}

// TestTrainRefusesBadInput: arguments and a checkpoint that is not one are refused
// by name, and the bad checkpoint is left as it was.
func TestTrainRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{dir}, "usage: probe train"},
		{[]string{dir, "0"}, `EPOCHS "0" is not a positive number`},
		{[]string{dir, "3", "soon"}, `EPOCH_TIME "soon" is not a duration`},
	} {
		if out, err := train(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("probe train %v: %v (%s); want %q", tc.args, err, out, tc.want)
		}
	}
	path := filepath.Join(dir, checkpointName)
	for _, bad := range []string{"{not json", `{"epoch": 3, "weights": [1, 2]}`} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := train(t, dir, "4"); err == nil || !strings.Contains(err.Error(), "checkpoint "+path) || !strings.Contains(err.Error(), "move it away to start over") {
			t.Errorf("checkpoint %q: %v; want a refusal naming %s", bad, err, path)
		}
		if data, _ := os.ReadFile(path); string(data) != bad {
			t.Errorf("the bad checkpoint was changed to %q", data)
		}
	}
}

// TestTrainFullVolume: on a real filesystem that is full (a tmpfs of 64 KiB, filled
// after epoch 1's checkpoint), the next epoch's checkpoint fails with an error that
// says so and which checkpoint is kept, and epoch 1's checkpoint is intact.
func TestTrainFullVolume(t *testing.T) {
	testreq.Root(t, "mounting a small tmpfs to fill")
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if out, err := train(t, dir, "1"); err != nil {
		t.Fatalf("epoch 1: %v\n%s", err, out)
	}
	before, err := os.ReadFile(filepath.Join(dir, checkpointName))
	if err != nil {
		t.Fatal(err)
	}
	fill, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := fill.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	fill.Close()
	out, err := train(t, dir, "3")
	if err == nil || !strings.Contains(err.Error(), "no space left on device") ||
		!strings.Contains(err.Error(), "epoch 2 trained but its checkpoint was not saved") || !strings.Contains(err.Error(), "the checkpoint of epoch 1 is kept") {
		t.Fatalf("a full volume: %v\n%s\nwant the checkpoint's failure, saying epoch 1's is kept", err, out)
	}
	t.Logf("on a full volume: %v", err)
	after, err := os.ReadFile(filepath.Join(dir, checkpointName))
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("epoch 1's checkpoint changed on a full volume (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, checkpointName+".tmp")); !os.IsNotExist(err) {
		t.Errorf("the half-written checkpoint was left behind: %v", err)
	}
	if ck, err := loadCheckpoint(dir); err != nil || ck.Epoch != 1 {
		t.Errorf("the kept checkpoint: %+v, %v; want epoch 1", ck, err)
	}
}

// TestPredictServes: probe predict answers with the model a training run left: the
// two classes' centres are told apart, the answer names the epoch and says it was
// computed on the CPU, and bad features get 400 with what is wrong.
func TestPredictServes(t *testing.T) {
	dir := t.TempDir()
	if out, err := train(t, dir, "5"); err != nil {
		t.Fatalf("train: %v\n%s", err, out)
	}
	ck, err := loadCheckpoint(dir)
	if err != nil || ck == nil {
		t.Fatalf("checkpoint: %+v, %v", ck, err)
	}
	srv := httptest.NewServer(predictHandler(*ck, "replica-1"))
	defer srv.Close()
	for want, v := range map[int]string{0: "-0.5", 1: "0.5"} {
		resp, err := http.Get(srv.URL + "/predict?x=" + strings.Repeat(v+",", trainFeatures-1) + v)
		if err != nil {
			t.Fatal(err)
		}
		var p prediction
		err = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || p.Class != want || p.ModelEpoch != 5 || p.Replica != "replica-1" || p.Compute != "CPU (CUDA unavailable)" {
			t.Errorf("class %d's centre: %d %+v %v; want class %d of the epoch-5 model, on the CPU", want, resp.StatusCode, p, err, want)
		}
	}
	for _, bad := range []string{"", "1,2", strings.Repeat("1,", trainFeatures-1) + "x"} {
		resp, err := http.Get(srv.URL + "/predict?x=" + bad)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "x: ") {
			t.Errorf("x=%q: %d %s; want 400 saying what is wrong with x", bad, resp.StatusCode, body)
		}
	}
	var out bytes.Buffer
	if err := run([]string{"predict", t.TempDir()}, &out, filepath.Join(t.TempDir(), "log")); err == nil || !strings.Contains(err.Error(), "no checkpoint in") {
		t.Errorf("predict without a checkpoint: %v; want a refusal", err)
	}
}
