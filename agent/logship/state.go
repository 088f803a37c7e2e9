package logship

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// fileKey names one container log file: its path and inode (a rotation puts a new
// inode at the same path).
type fileKey struct {
	path  string
	inode uint64
}

// fileState is where shipping of one file got to.
type fileState struct {
	Inode  uint64 `json:"inode"`
	Offset int64  `json:"offset"`
}

// state is what the store took so far, kept in a file under /run/gpurack: it survives
// an agent restart, not a reboot, so the next boot ships its own journal from its start
// (the previous boot's lines were shipped while it ran).
type state struct {
	// BootID is the boot the positions belong to; a state of another boot is ignored.
	BootID        string               `json:"boot_id"`
	JournalCursor string               `json:"journal_cursor,omitempty"`
	Files         map[string]fileState `json:"files,omitempty"`
}

// loadState reads the state file; a missing file, one of another boot or one that does
// not parse (said in the error) gives an empty state for bootID.
func loadState(path, bootID string) (state, error) {
	empty := state{BootID: bootID, Files: map[string]fileState{}}
	if path == "" {
		return empty, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return empty, nil
	}
	if err != nil {
		return empty, fmt.Errorf("log shipping state %s: %w", path, err)
	}
	var s state
	if err := json.Unmarshal(data, &s); err != nil {
		return empty, fmt.Errorf("log shipping state %s does not parse (%v): starting from the start of the boot", path, err)
	}
	if s.BootID != bootID {
		return empty, nil
	}
	if s.Files == nil {
		s.Files = map[string]fileState{}
	}
	return s, nil
}

// advance moves the state past a batch the store took.
func (s *state) advance(batch []Entry) {
	for i := range batch {
		e := &batch[i]
		if e.cursor != "" {
			s.JournalCursor = e.cursor
		}
		if e.file.path != "" {
			s.Files[e.file.path] = fileState{Inode: e.file.inode, Offset: e.offset}
		}
	}
}

// save writes the state, forgetting files that are gone.
func (s *state) save(path string) error {
	if path == "" {
		return nil
	}
	for p := range s.Files {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			delete(s.Files, p)
		}
	}
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return atomicfile.WriteMkdirAll(path, data, 0o600, 0o700)
}
