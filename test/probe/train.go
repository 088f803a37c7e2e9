package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The training workload of the user's-day checks (issue 30): logistic regression by
// gradient descent on a fixed synthetic dataset, on the CPU, with a checkpoint after
// every epoch. It is small on purpose (a QEMU node under TCG runs it), but the work is
// real: each epoch is full passes over the data, and the loss it prints falls.

const (
	trainSamples  = 2000
	trainFeatures = 16
	// trainSteps are the gradient steps of one epoch.
	trainSteps = 25
	// checkpointName is the checkpoint in the directory given; a new one is written
	// beside it (checkpointName+".tmp"), synced, and renamed over it, so a failed
	// write leaves the previous checkpoint whole.
	checkpointName = "checkpoint.json"
)

// checkpoint is what an epoch leaves: enough to go on from it.
type checkpoint struct {
	Epoch    int       `json:"epoch"`
	Loss     float64   `json:"loss"`
	Accuracy float64   `json:"accuracy"`
	Weights  []float64 `json:"weights"`
	Bias     float64   `json:"bias"`
}

// trainCommand: probe train DIR EPOCHS [EPOCH_TIME]. It goes on from DIR's checkpoint
// when there is one, trains to epoch EPOCHS, and checkpoints each epoch; EPOCH_TIME
// (default 0) pads each epoch with sleep to at least that long, so that a test can
// delete the pod between two checkpoints. A checkpoint it cannot write ends it with an
// error that names the file and says which checkpoint is kept.
func trainCommand(args []string, stdout io.Writer, _ string) error {
	if len(args) != 2 && len(args) != 3 {
		return errors.New("usage: probe train DIR EPOCHS [EPOCH_TIME]")
	}
	dir := args[0]
	epochs, err := strconv.Atoi(args[1])
	if err != nil || epochs < 1 {
		return fmt.Errorf("EPOCHS %q is not a positive number", args[1])
	}
	var pace time.Duration
	if len(args) == 3 {
		if pace, err = time.ParseDuration(args[2]); err != nil || pace < 0 {
			return fmt.Errorf("EPOCH_TIME %q is not a duration (for example 3s)", args[2])
		}
	}
	fmt.Fprintf(stdout, "CUDA: unavailable (this image has no CUDA runtime; GPUs given: NVIDIA_VISIBLE_DEVICES=%q): training on the CPU\n",
		os.Getenv("NVIDIA_VISIBLE_DEVICES"))
	ck, err := loadCheckpoint(dir)
	switch {
	case err != nil:
		return err
	case ck == nil:
		ck = &checkpoint{Weights: make([]float64, trainFeatures)}
		fmt.Fprintf(stdout, "no checkpoint in %s: starting at epoch 1\n", dir)
	default:
		fmt.Fprintf(stdout, "resumed from the checkpoint of epoch %d (loss %.4f)\n", ck.Epoch, ck.Loss)
	}
	x, y := trainData()
	for ck.Epoch < epochs {
		start := time.Now()
		next := trainEpoch(*ck, x, y)
		if err := saveCheckpoint(dir, next); err != nil {
			return fmt.Errorf("epoch %d trained but its checkpoint was not saved: %w; the checkpoint of epoch %d is kept", next.Epoch, err, ck.Epoch)
		}
		ck = &next
		fmt.Fprintf(stdout, "epoch %d/%d loss %.4f accuracy %.3f (CPU), checkpoint saved\n", ck.Epoch, epochs, ck.Loss, ck.Accuracy)
		if rest := pace - time.Since(start); rest > 0 && ck.Epoch < epochs {
			time.Sleep(rest)
		}
	}
	fmt.Fprintf(stdout, "done: %d epochs, computed on the CPU\n", ck.Epoch)
	return nil
}

// trainData is the fixed dataset: two Gaussian classes in trainFeatures dimensions,
// their means a unit apart on every axis, from a fixed seed.
func trainData() ([][]float64, []float64) {
	r := rand.New(rand.NewPCG(30, 1))
	x, y := make([][]float64, trainSamples), make([]float64, trainSamples)
	for i := range x {
		label := float64(i % 2)
		x[i] = make([]float64, trainFeatures)
		for j := range x[i] {
			x[i][j] = r.NormFloat64() + label - 0.5
		}
		y[i] = label
	}
	return x, y
}

// trainEpoch runs trainSteps full-batch gradient steps from ck and returns the next
// checkpoint, with the loss and accuracy after them.
func trainEpoch(ck checkpoint, x [][]float64, y []float64) checkpoint {
	const rate = 0.5
	w := append([]float64(nil), ck.Weights...)
	b := ck.Bias
	grad := make([]float64, len(w))
	for range trainSteps {
		clear(grad)
		var gb float64
		for i, xi := range x {
			d := sigmoid(dot(w, xi)+b) - y[i]
			for j, v := range xi {
				grad[j] += d * v
			}
			gb += d
		}
		for j := range w {
			w[j] -= rate * grad[j] / float64(len(x))
		}
		b -= rate * gb / float64(len(x))
	}
	var loss float64
	right := 0
	for i, xi := range x {
		p := min(max(sigmoid(dot(w, xi)+b), 1e-12), 1-1e-12)
		loss -= y[i]*math.Log(p) + (1-y[i])*math.Log(1-p)
		if (p >= 0.5) == (y[i] == 1) {
			right++
		}
	}
	return checkpoint{Epoch: ck.Epoch + 1, Loss: loss / float64(len(x)), Accuracy: float64(right) / float64(len(x)), Weights: w, Bias: b}
}

func sigmoid(v float64) float64 { return 1 / (1 + math.Exp(-v)) }

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// loadCheckpoint reads dir's checkpoint: nil when there is none; an error naming the
// file when it does not read as one (training does not silently start over).
func loadCheckpoint(dir string) (*checkpoint, error) {
	path := filepath.Join(dir, checkpointName)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ck checkpoint
	if err := json.Unmarshal(data, &ck); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %v; move it away to start over", path, err)
	}
	if ck.Epoch < 1 || len(ck.Weights) != trainFeatures {
		return nil, fmt.Errorf("checkpoint %s: epoch %d with %d weights, not a checkpoint of this model (%d weights); move it away to start over",
			path, ck.Epoch, len(ck.Weights), trainFeatures)
	}
	return &ck, nil
}

// saveCheckpoint writes ck beside dir's checkpoint, syncs it and renames it over the
// old one, then syncs dir: the old checkpoint is replaced whole or not at all.
func saveCheckpoint(dir string, ck checkpoint) error {
	data, err := json.Marshal(ck)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, checkpointName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, checkpointName))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
