package gpucompute

import (
	"encoding/binary"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A small PTX interpreter for the instructions gpurack's kernels use, so that their
// semantics (tiling, indexing, barriers, grid-stride loops) are tested without a GPU:
// every thread of a block runs until it reaches bar.sync or ret, then the block goes
// on past the barrier. It knows nothing of warps, timing or memory ordering beyond
// that. It stops with an error on an instruction it does not know, so a kernel edit
// that uses a new one has to extend it.

type simInst struct {
	pred, op string
	neg      bool
	args     []string
	line     int
}

type simKernel struct {
	params  []string
	shared  map[string]int // offset of each .shared variable
	sharedN int
	insts   []simInst
	labels  map[string]int
}

var (
	simSharedRE = regexp.MustCompile(`^\.shared\s+\.align\s+(\d+)\s+\.b8\s+(\w+)\[(\d+)\];$`)
	simAddrRE   = regexp.MustCompile(`^\[([%\w$]+)(?:\+(-?\d+))?\]$`)
)

// simCompile reads the body of entry from a PTX module's text.
func simCompile(text, entry string) (*simKernel, error) {
	m, err := ParsePTX(text)
	if err != nil {
		return nil, err
	}
	e := m.Entry(entry)
	if e == nil {
		return nil, fmt.Errorf("no entry %s", entry)
	}
	k := &simKernel{shared: map[string]int{}, labels: map[string]int{}}
	for _, p := range e.Params {
		k.params = append(k.params, p.Name)
	}
	start := strings.Index(text, ".entry "+entry)
	body := text[start+strings.Index(text[start:], "{")+1:]
	for i, line := range strings.Split(body, "\n") {
		if j := strings.Index(line, "//"); j >= 0 {
			line = line[:j]
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line == "}" || strings.HasPrefix(line, ".reg"):
		case strings.HasPrefix(line, ".shared"):
			sm := simSharedRE.FindStringSubmatch(line)
			if sm == nil {
				return nil, fmt.Errorf("line %d: shared declaration %q", i, line)
			}
			align, _ := strconv.Atoi(sm[1])
			size, _ := strconv.Atoi(sm[3])
			k.sharedN = (k.sharedN + align - 1) / align * align
			k.shared[sm[2]] = k.sharedN
			k.sharedN += size
		case strings.HasSuffix(line, ":"):
			k.labels[strings.TrimSuffix(line, ":")] = len(k.insts)
		default:
			in := simInst{line: i}
			line = strings.TrimSuffix(line, ";")
			if strings.HasPrefix(line, "@") {
				g, rest, _ := strings.Cut(line, " ")
				in.pred, in.neg, line = strings.TrimPrefix(strings.TrimPrefix(g, "@"), "!"), strings.HasPrefix(g, "@!"), rest
			}
			op, rest, _ := strings.Cut(line, " ")
			in.op = op
			in.args = simSplitArgs(rest)
			k.insts = append(k.insts, in)
		}
	}
	return k, nil
}

// simSplitArgs splits operands at commas outside braces.
func simSplitArgs(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if t := strings.TrimSpace(s[start:]); t != "" {
		out = append(out, t)
	}
	return out
}

// simThread is one thread's registers and program counter.
type simThread struct {
	regs            map[string]uint64
	tid, ctaid      [2]uint32
	pc              int
	done, atBarrier bool
}

// simGrid is a launch: memory, parameters and dimensions.
type simGrid struct {
	k            *simKernel
	global       []byte // device memory; address a is global[a-simBase]
	params       map[string]uint64
	grid, block  [2]uint32
	shared       []byte
	instructions int
}

const simBase = 1 << 20

func (g *simGrid) mem(space string, addr uint64, n int) ([]byte, error) {
	if addr%uint64(n) != 0 { // PTX: an access is aligned to its size (16 bytes for .v4.f32)
		return nil, fmt.Errorf("%s access of %d bytes at %#x is misaligned", space, n, addr)
	}
	if space == "shared" {
		if addr+uint64(n) > uint64(len(g.shared)) {
			return nil, fmt.Errorf("shared access at %d+%d outside %d bytes", addr, n, len(g.shared))
		}
		return g.shared[addr : addr+uint64(n)], nil
	}
	if addr < simBase || addr-simBase+uint64(n) > uint64(len(g.global)) {
		return nil, fmt.Errorf("global access at %#x+%d outside memory", addr, n)
	}
	return g.global[addr-simBase : addr-simBase+uint64(n)], nil
}

// run executes every block of the grid.
func (g *simGrid) run() error {
	for by := uint32(0); by < g.grid[1]; by++ {
		for bx := uint32(0); bx < g.grid[0]; bx++ {
			if err := g.runBlock([2]uint32{bx, by}); err != nil {
				return fmt.Errorf("block (%d,%d): %w", bx, by, err)
			}
		}
	}
	return nil
}

func (g *simGrid) runBlock(ctaid [2]uint32) error {
	g.shared = make([]byte, g.k.sharedN)
	var threads []*simThread
	for ty := uint32(0); ty < g.block[1]; ty++ {
		for tx := uint32(0); tx < g.block[0]; tx++ {
			threads = append(threads, &simThread{regs: map[string]uint64{}, tid: [2]uint32{tx, ty}, ctaid: ctaid})
		}
	}
	for {
		done, waiting := 0, 0
		for _, t := range threads {
			if !t.done {
				t.atBarrier = false
				if err := g.step(t); err != nil {
					return fmt.Errorf("thread (%d,%d): %w", t.tid[0], t.tid[1], err)
				}
			}
			if t.done {
				done++
			} else if t.atBarrier {
				waiting++
			}
		}
		switch {
		case done == len(threads):
			return nil
		case done > 0 && waiting > 0:
			return fmt.Errorf("%d threads returned while %d wait at a barrier", done, waiting)
		}
	}
}

// step runs t until it reaches a barrier (past it) or returns.
func (g *simGrid) step(t *simThread) error {
	for t.pc < len(g.k.insts) {
		in := g.k.insts[t.pc]
		t.pc++
		g.instructions++
		if g.instructions > 50_000_000 {
			return fmt.Errorf("over 50M instructions: a loop that does not end?")
		}
		if in.pred != "" && (t.regs[in.pred] != 0) == in.neg {
			continue
		}
		switch in.op {
		case "ret":
			t.done = true
			return nil
		case "bar.sync":
			t.atBarrier = true
			return nil
		case "bra":
			pc, ok := g.k.labels[in.args[0]]
			if !ok {
				return fmt.Errorf("line %d: no label %s", in.line, in.args[0])
			}
			t.pc = pc
			continue
		}
		if err := g.exec(t, in); err != nil {
			return fmt.Errorf("line %d (%s %s): %w", in.line, in.op, strings.Join(in.args, ", "), err)
		}
	}
	return fmt.Errorf("ran off the end of the kernel")
}

// value reads an operand: a register, a special register, a shared variable's address
// or an immediate.
func (g *simGrid) value(t *simThread, s string) (uint64, error) {
	switch s {
	case "%tid.x":
		return uint64(t.tid[0]), nil
	case "%tid.y":
		return uint64(t.tid[1]), nil
	case "%ctaid.x":
		return uint64(t.ctaid[0]), nil
	case "%ctaid.y":
		return uint64(t.ctaid[1]), nil
	case "%ntid.x":
		return uint64(g.block[0]), nil
	case "%nctaid.x":
		return uint64(g.grid[0]), nil
	}
	if strings.HasPrefix(s, "%") {
		return t.regs[s], nil
	}
	if off, ok := g.k.shared[s]; ok {
		return uint64(off), nil
	}
	if strings.HasPrefix(s, "0f") {
		v, err := strconv.ParseUint(s[2:], 16, 32)
		return v, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return uint64(v), err
}

func (g *simGrid) address(t *simThread, s string) (uint64, error) {
	m := simAddrRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("address %q", s)
	}
	base, ok := g.params[m[1]]
	if !ok {
		var err error
		if base, err = g.value(t, m[1]); err != nil {
			return 0, err
		}
	}
	off, _ := strconv.ParseInt(m[2], 10, 64)
	return base + uint64(off), nil
}

func f32(v uint64) float32  { return math.Float32frombits(uint32(v)) }
func bits(f float32) uint64 { return uint64(math.Float32bits(f)) }

// exec runs one arithmetic, move or memory instruction.
func (g *simGrid) exec(t *simThread, in simInst) error {
	parts := strings.Split(in.op, ".")
	typ := parts[len(parts)-1]
	mask := uint64(math.MaxUint64)
	if typ == "u32" || typ == "b32" || typ == "s32" || typ == "f32" {
		mask = math.MaxUint32
	}
	if parts[0] == "ld" || parts[0] == "st" {
		return g.memory(t, in, parts)
	}
	vals := make([]uint64, len(in.args))
	for i, a := range in.args[1:] {
		v, err := g.value(t, a)
		if err != nil {
			return err
		}
		vals[i+1] = v
	}
	d := in.args[0]
	switch parts[0] + "." + strings.Join(parts[1:len(parts)-1], ".") {
	case "mov.", "cvta.to.global", "cvt.u64":
		t.regs[d] = vals[1] & mask
	case "add.":
		t.regs[d] = (vals[1] + vals[2]) & mask
	case "shl.":
		t.regs[d] = (vals[1] << vals[2]) & mask
	case "shr.":
		t.regs[d] = (vals[1] & mask) >> vals[2]
	case "and.":
		t.regs[d] = vals[1] & vals[2] & mask
	case "mad.lo":
		t.regs[d] = (vals[1]*vals[2] + vals[3]) & mask
	case "mul.wide":
		t.regs[d] = (vals[1] & math.MaxUint32) * (vals[2] & math.MaxUint32)
	case "fma.rn":
		t.regs[d] = bits(float32(math.FMA(float64(f32(vals[1])), float64(f32(vals[2])), float64(f32(vals[3])))))
	case "setp.lt":
		t.regs[d] = b2u(vals[1]&mask < vals[2]&mask)
	case "setp.ge":
		t.regs[d] = b2u(vals[1]&mask >= vals[2]&mask)
	default:
		return fmt.Errorf("the interpreter does not know %s", in.op)
	}
	return nil
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// memory runs ld and st: .param, .global and .shared, scalar or .v4, 32 or 64 bits.
func (g *simGrid) memory(t *simThread, in simInst, parts []string) error {
	space, typ := parts[1], parts[len(parts)-1]
	size := 4
	if typ == "u64" {
		size = 8
	}
	addrArg, regArg := in.args[1], in.args[0]
	if parts[0] == "st" {
		addrArg, regArg = in.args[0], in.args[1]
	}
	if space == "param" {
		name := strings.Trim(addrArg, "[]")
		v, ok := g.params[name]
		if !ok {
			return fmt.Errorf("no parameter %s", name)
		}
		t.regs[regArg] = v
		return nil
	}
	regs := []string{regArg}
	if parts[2] == "v4" {
		regs = strings.Split(strings.Trim(regArg, "{}"), ",")
	}
	addr, err := g.address(t, addrArg)
	if err != nil {
		return err
	}
	b, err := g.mem(space, addr, size*len(regs))
	if err != nil {
		return err
	}
	for i, r := range regs {
		r = strings.TrimSpace(r)
		w := b[i*size : (i+1)*size]
		if parts[0] == "ld" {
			t.regs[r] = uint64(binary.LittleEndian.Uint32(w))
		} else {
			binary.LittleEndian.PutUint32(w, uint32(t.regs[r]))
		}
	}
	return nil
}

// simAlloc places float32 words in global memory and returns their address.
func simAlloc(g *simGrid, words int) uint64 {
	addr := uint64(simBase + len(g.global))
	g.global = append(g.global, make([]byte, (words*4+255)/256*256)...)
	return addr
}

func simWrite(g *simGrid, addr uint64, w []float32) {
	for i, f := range w {
		binary.LittleEndian.PutUint32(g.global[addr-simBase+uint64(4*i):], math.Float32bits(f))
	}
}

func simRead(g *simGrid, addr uint64, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(g.global[addr-simBase+uint64(4*i):]))
	}
	return out
}

// TestSGEMMKernelComputesAProduct runs sgemm_tiled's PTX, as launched by
// gc_launch_sgemm (grid N/64 × N/64, blocks of 16×16), and compares every entry of C
// with the CPU's product: two tiles along each axis and eight steps along K.
func TestSGEMMKernelComputesAProduct(t *testing.T) {
	k, err := simCompile(SGEMMPTX, "sgemm_tiled")
	if err != nil {
		t.Fatal(err)
	}
	const n = 128
	g := &simGrid{k: k, grid: [2]uint32{n / 64, n / 64}, block: [2]uint32{16, 16}}
	a, b := make([]float32, n*n), make([]float32, n*n)
	FillMatrix(a, 1)
	FillMatrix(b, 2)
	pa, pb, pc := simAlloc(g, n*n), simAlloc(g, n*n), simAlloc(g, n*n)
	simWrite(g, pa, a)
	simWrite(g, pb, b)
	g.params = map[string]uint64{k.params[0]: pa, k.params[1]: pb, k.params[2]: pc, k.params[3]: n}
	if err := g.run(); err != nil {
		t.Fatal(err)
	}
	c := simRead(g, pc, n*n)
	var all []Position
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			all = append(all, Position{i, j})
		}
	}
	maxErr, err := Verify(a, b, c, n, all)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sgemm_tiled N=%d in the interpreter: %d instructions, max relative error %.2g over all %d entries", n, g.instructions, maxErr, n*n)
}

// TestCopyKernelCopiesExactly runs copy_f4's PTX with a grid smaller than the data (the
// grid-stride loop) and checks the copy and that nothing past n4 is written.
func TestCopyKernelCopiesExactly(t *testing.T) {
	k, err := simCompile(CopyPTX, "copy_f4")
	if err != nil {
		t.Fatal(err)
	}
	const n4, extra = 1000, 8 // 16-byte elements, and words past the end
	g := &simGrid{k: k, grid: [2]uint32{3, 1}, block: [2]uint32{64, 1}}
	src, dst := simAlloc(g, n4*4+extra), simAlloc(g, n4*4+extra)
	in := make([]float32, n4*4+extra)
	for i := range in {
		in[i] = float32(i) + 0.5
	}
	simWrite(g, src, in)
	sentinel := make([]float32, n4*4+extra)
	for i := range sentinel {
		sentinel[i] = -1
	}
	simWrite(g, dst, sentinel)
	g.params = map[string]uint64{k.params[0]: dst, k.params[1]: src, k.params[2]: n4}
	if err := g.run(); err != nil {
		t.Fatal(err)
	}
	out := simRead(g, dst, n4*4+extra)
	for i, v := range out {
		want := in[i]
		if i >= n4*4 {
			want = -1
		}
		if v != want {
			t.Fatalf("dst word %d = %v, want %v", i, v, want)
		}
	}
}

// TestInterpreterRejectsUnknownInstructions: a kernel that uses an instruction the
// interpreter lacks fails the test instead of passing untested.
func TestInterpreterRejectsUnknownInstructions(t *testing.T) {
	text := strings.Replace(CopyPTX, "shl.b64 %rd6, %rd4, 4;", "mul.lo.u64 %rd6, %rd4, 16;", 1)
	k, err := simCompile(text, "copy_f4")
	if err != nil {
		t.Fatal(err)
	}
	g := &simGrid{k: k, grid: [2]uint32{1, 1}, block: [2]uint32{1, 1}}
	src, dst := simAlloc(g, 4), simAlloc(g, 4)
	g.params = map[string]uint64{k.params[0]: dst, k.params[1]: src, k.params[2]: 1}
	if err := g.run(); err == nil || !strings.Contains(err.Error(), "does not know mul.lo.u64") {
		t.Fatalf("unknown instruction: %v", err)
	}
}

// TestSGEMMKernelSlipsFail: the interpreter catches indexing slips a kernel edit could
// make (A's tile stored untransposed; B stepping one row short per tile), so a passing
// TestSGEMMKernelComputesAProduct means something.
func TestSGEMMKernelSlipsFail(t *testing.T) {
	for _, slip := range [][2]string{
		{"mad.lo.u32 %r15, %r2, 64, %r3;", "mad.lo.u32 %r15, %r3, 64, %r2;"},
		{"add.u64 %rd8, %rd8, %rd6;       // B: 16 rows on", "add.u64 %rd8, %rd8, %rd9;"},
	} {
		text := strings.Replace(SGEMMPTX, slip[0], slip[1], 1)
		if text == SGEMMPTX {
			t.Fatalf("the kernel no longer has %q", slip[0])
		}
		k, err := simCompile(text, "sgemm_tiled")
		if err != nil {
			t.Fatal(err)
		}
		const n = 64
		g := &simGrid{k: k, grid: [2]uint32{1, 1}, block: [2]uint32{16, 16}}
		a, b := make([]float32, n*n), make([]float32, n*n)
		FillMatrix(a, 1)
		FillMatrix(b, 2)
		pa, pb, pc := simAlloc(g, n*n), simAlloc(g, n*n), simAlloc(g, n*n)
		simWrite(g, pa, a)
		simWrite(g, pb, b)
		g.params = map[string]uint64{k.params[0]: pa, k.params[1]: pb, k.params[2]: pc, k.params[3]: n}
		err = g.run()
		if err == nil {
			_, err = Verify(a, b, simRead(g, pc, n*n), n, SampleEntries(n, 64))
		}
		if err == nil {
			t.Errorf("slip %q → %q went unnoticed", slip[0], slip[1])
		}
	}
}
