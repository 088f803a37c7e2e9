package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The serving workload of the user's-day checks (issue 30): the model `probe train`
// left in a checkpoint, answering predictions over HTTP, on the CPU.

// predictCommand: probe predict DIR [-listen ADDR]. It loads DIR's checkpoint once and
// serves GET /predict?x=F1,…,F16 (the class, its probability, the model's epoch, the
// replica) and GET /healthz; without a checkpoint it does not start.
func predictCommand(args []string, stdout io.Writer, _ string) error {
	fs := flag.NewFlagSet("predict", flag.ContinueOnError)
	fs.SetOutput(stdout)
	listen := fs.String("listen", ":8080", "address to serve predictions on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: probe predict DIR [-listen ADDR]")
	}
	dir := fs.Arg(0)
	ck, err := loadCheckpoint(dir)
	if err != nil {
		return err
	}
	if ck == nil {
		return fmt.Errorf("no checkpoint in %s: train a model first (probe train %s EPOCHS)", dir, dir)
	}
	fmt.Fprintf(stdout, "CUDA: unavailable (this image has no CUDA runtime): predicting on the CPU\n")
	fmt.Fprintf(stdout, "serving the model of epoch %d (accuracy %.3f) on %s\n", ck.Epoch, ck.Accuracy, *listen)
	srv := &http.Server{Addr: *listen, Handler: predictHandler(*ck, hostname()), ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

// prediction is /predict's answer.
type prediction struct {
	Class       int     `json:"class"`
	Probability float64 `json:"probability"`
	ModelEpoch  int     `json:"modelEpoch"`
	Replica     string  `json:"replica"`
	Compute     string  `json:"compute"`
}

// predictHandler answers with ck's model; host names the replica in each answer.
func predictHandler(ck checkpoint, host string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /predict", func(w http.ResponseWriter, r *http.Request) {
		x, err := parseFeatures(r.URL.Query().Get("x"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p := sigmoid(dot(ck.Weights, x) + ck.Bias)
		class := 0
		if p >= 0.5 {
			class = 1
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(prediction{Class: class, Probability: p, ModelEpoch: ck.Epoch, Replica: host,
			Compute: "CPU (CUDA unavailable)"})
	})
	return mux
}

// parseFeatures reads the query's x: trainFeatures numbers separated by commas.
func parseFeatures(s string) ([]float64, error) {
	parts := strings.Split(s, ",")
	if s == "" || len(parts) != trainFeatures {
		return nil, fmt.Errorf("x: want %d numbers separated by commas, got %d", trainFeatures, len(parts))
	}
	x := make([]float64, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil {
			return nil, fmt.Errorf("x: number %d, %q, is not a number", i+1, p)
		}
		x[i] = v
	}
	return x, nil
}
