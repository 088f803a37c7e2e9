//go:build cgo

package gpucompute

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// The few CUDA driver API types used, as cuda.h declares them; the library is dlopened,
// so no CUDA header is needed to build.
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;

static void *gc_lib;
static CUresult (*p_cuInit)(unsigned int);
static CUresult (*p_cuDriverGetVersion)(int *);
static CUresult (*p_cuDeviceGetCount)(int *);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDeviceGetByPCIBusId)(CUdevice *, const char *);
static CUresult (*p_cuDeviceGetName)(char *, int, CUdevice);
static CUresult (*p_cuDeviceGetAttribute)(int *, int, CUdevice);
static CUresult (*p_cuCtxCreate)(CUcontext *, unsigned int, CUdevice);
static CUresult (*p_cuCtxDestroy)(CUcontext);
static CUresult (*p_cuCtxSynchronize)(void);
static CUresult (*p_cuModuleLoadDataEx)(CUmodule *, const void *, unsigned int, int *, void **);
static CUresult (*p_cuModuleUnload)(CUmodule);
static CUresult (*p_cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree)(CUdeviceptr);
static CUresult (*p_cuMemAllocHost)(void **, size_t);
static CUresult (*p_cuMemFreeHost)(void *);
static CUresult (*p_cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*p_cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*p_cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
static CUresult (*p_cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
static CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
static CUresult (*p_cuEventCreate)(CUevent *, unsigned int);
static CUresult (*p_cuEventDestroy)(CUevent);
static CUresult (*p_cuEventRecord)(CUevent, CUstream);
static CUresult (*p_cuEventSynchronize)(CUevent);
static CUresult (*p_cuEventElapsedTime)(float *, CUevent, CUevent);
static CUresult (*p_cuGetErrorName)(CUresult, const char **);
static CUresult (*p_cuGetErrorString)(CUresult, const char **);

#define GC_SYM(var, name) do { *(void **)(&var) = dlsym(gc_lib, name); if (!var) { snprintf(err, errlen, "symbol %s not found", name); return 2; } } while (0)

// gc_open loads the library and its symbols (the _v2 entry points, as cuda.h maps
// them): 0 when done, 1 when dlopen failed, 2 when a symbol is missing; err says why.
static int gc_open(const char *path, char *err, size_t errlen) {
	gc_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!gc_lib) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	GC_SYM(p_cuInit, "cuInit");
	GC_SYM(p_cuDriverGetVersion, "cuDriverGetVersion");
	GC_SYM(p_cuDeviceGetCount, "cuDeviceGetCount");
	GC_SYM(p_cuDeviceGet, "cuDeviceGet");
	GC_SYM(p_cuDeviceGetByPCIBusId, "cuDeviceGetByPCIBusId");
	GC_SYM(p_cuDeviceGetName, "cuDeviceGetName");
	GC_SYM(p_cuDeviceGetAttribute, "cuDeviceGetAttribute");
	GC_SYM(p_cuCtxCreate, "cuCtxCreate_v2");
	GC_SYM(p_cuCtxDestroy, "cuCtxDestroy_v2");
	GC_SYM(p_cuCtxSynchronize, "cuCtxSynchronize");
	GC_SYM(p_cuModuleLoadDataEx, "cuModuleLoadDataEx");
	GC_SYM(p_cuModuleUnload, "cuModuleUnload");
	GC_SYM(p_cuModuleGetFunction, "cuModuleGetFunction");
	GC_SYM(p_cuMemAlloc, "cuMemAlloc_v2");
	GC_SYM(p_cuMemFree, "cuMemFree_v2");
	GC_SYM(p_cuMemAllocHost, "cuMemAllocHost_v2");
	GC_SYM(p_cuMemFreeHost, "cuMemFreeHost");
	GC_SYM(p_cuMemcpyHtoD, "cuMemcpyHtoD_v2");
	GC_SYM(p_cuMemcpyDtoH, "cuMemcpyDtoH_v2");
	GC_SYM(p_cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
	GC_SYM(p_cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
	GC_SYM(p_cuLaunchKernel, "cuLaunchKernel");
	GC_SYM(p_cuEventCreate, "cuEventCreate");
	GC_SYM(p_cuEventDestroy, "cuEventDestroy_v2");
	GC_SYM(p_cuEventRecord, "cuEventRecord");
	GC_SYM(p_cuEventSynchronize, "cuEventSynchronize");
	GC_SYM(p_cuEventElapsedTime, "cuEventElapsedTime");
	GC_SYM(p_cuGetErrorName, "cuGetErrorName");
	GC_SYM(p_cuGetErrorString, "cuGetErrorString");
	return 0;
}

// cgo cannot call through function pointers: one small wrapper each.
static CUresult gc_init(void) { return p_cuInit(0); }
static CUresult gc_driver_version(int *v) { return p_cuDriverGetVersion(v); }
static CUresult gc_device_count(int *n) { return p_cuDeviceGetCount(n); }
static CUresult gc_device_get(CUdevice *d, int ordinal) { return p_cuDeviceGet(d, ordinal); }
static CUresult gc_device_by_bus(CUdevice *d, const char *bus) { return p_cuDeviceGetByPCIBusId(d, bus); }
static CUresult gc_device_name(char *name, int len, CUdevice d) { return p_cuDeviceGetName(name, len, d); }
static CUresult gc_device_attr(int *v, int attr, CUdevice d) { return p_cuDeviceGetAttribute(v, attr, d); }
static CUresult gc_ctx_create(CUcontext *c, CUdevice d) { return p_cuCtxCreate(c, 0, d); }
static CUresult gc_ctx_destroy(CUcontext c) { return p_cuCtxDestroy(c); }
static CUresult gc_ctx_sync(void) { return p_cuCtxSynchronize(); }
static CUresult gc_module_unload(CUmodule m) { return p_cuModuleUnload(m); }
static CUresult gc_module_function(CUfunction *f, CUmodule m, const char *name) { return p_cuModuleGetFunction(f, m, name); }
static CUresult gc_mem_alloc(CUdeviceptr *p, size_t n) { return p_cuMemAlloc(p, n); }
static CUresult gc_mem_free(CUdeviceptr p) { return p_cuMemFree(p); }
static CUresult gc_host_alloc(void **p, size_t n) { return p_cuMemAllocHost(p, n); }
static CUresult gc_host_free(void *p) { return p_cuMemFreeHost(p); }
static CUresult gc_htod(CUdeviceptr d, const void *h, size_t n) { return p_cuMemcpyHtoD(d, h, n); }
static CUresult gc_dtoh(void *h, CUdeviceptr d, size_t n) { return p_cuMemcpyDtoH(h, d, n); }
static CUresult gc_htod_async(CUdeviceptr d, const void *h, size_t n) { return p_cuMemcpyHtoDAsync(d, h, n, NULL); }
static CUresult gc_dtoh_async(void *h, CUdeviceptr d, size_t n) { return p_cuMemcpyDtoHAsync(h, d, n, NULL); }
static CUresult gc_event_create(CUevent *e) { return p_cuEventCreate(e, 0); }
static CUresult gc_event_destroy(CUevent e) { return p_cuEventDestroy(e); }
static CUresult gc_event_record(CUevent e) { return p_cuEventRecord(e, NULL); }
static CUresult gc_event_sync(CUevent e) { return p_cuEventSynchronize(e); }
static CUresult gc_event_elapsed(float *ms, CUevent a, CUevent b) { return p_cuEventElapsedTime(ms, a, b); }
static CUresult gc_error_name(CUresult r, const char **s) { return p_cuGetErrorName(r, s); }
static CUresult gc_error_string(CUresult r, const char **s) { return p_cuGetErrorString(r, s); }

// gc_load JIT-compiles PTX text, with the JIT's error log in log (CU_JIT_ERROR_LOG_BUFFER
// = 5, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6).
static CUresult gc_load(CUmodule *m, const char *ptx, char *log, unsigned int logsz) {
	int opts[2] = {5, 6};
	void *vals[2] = {log, (void *)(uintptr_t)logsz};
	log[0] = 0;
	return p_cuModuleLoadDataEx(m, ptx, 2, opts, vals);
}

// The launches, with kernelParams in the order of gpucompute.Kernels (and the PTX).
static CUresult gc_launch_sgemm(CUfunction f, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, unsigned int n) {
	void *params[] = {&a, &b, &c, &n};
	return p_cuLaunchKernel(f, n / 64, n / 64, 1, 16, 16, 1, 0, NULL, params, NULL);
}
static CUresult gc_launch_copy(CUfunction f, unsigned int blocks, CUdeviceptr dst, CUdeviceptr src, unsigned long long n4) {
	void *params[] = {&dst, &src, &n4};
	return p_cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, NULL, params, NULL);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// DefaultLibrary is the driver's CUDA library as the dynamic loader finds it.
const DefaultLibrary = "libcuda.so.1"

// cgoEnabled says which loader this build has (nocgo.go's has none).
const cgoEnabled = true

var lib struct {
	once    sync.Once
	path    string
	err     error
	version int
}

// open loads libcuda and calls cuInit once per process; later calls get the first
// outcome (a process has one libcuda).
func open(path string) (string, int, error) {
	if path == "" {
		path = DefaultLibrary
	}
	lib.once.Do(func() {
		lib.path = path
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		var buf [512]C.char
		switch C.gc_open(cpath, &buf[0], C.size_t(len(buf))) {
		case 0:
		case 1:
			lib.err = &LibraryError{Library: path, Reason: C.GoString(&buf[0])}
			return
		default:
			lib.err = fmt.Errorf("%s: %s: the driver's CUDA library is older than this check needs (CUDA 11 or later)", path, C.GoString(&buf[0]))
			return
		}
		if err := cuErr("cuInit", C.gc_init()); err != nil {
			lib.err = fmt.Errorf("%w: is the NVIDIA kernel driver loaded and /dev/nvidia* accessible?", err)
			return
		}
		var v C.int
		if err := cuErr("cuDriverGetVersion", C.gc_driver_version(&v)); err != nil {
			lib.err = err
			return
		}
		lib.version = int(v)
	})
	return lib.path, lib.version, lib.err
}

// cuErr turns a CUresult into an error naming the call, the result's name and its
// description; nil for CUDA_SUCCESS.
func cuErr(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	name, desc := "unknown CUresult", ""
	var s *C.char
	if C.gc_error_name(r, &s) == 0 && s != nil {
		name = C.GoString(s)
	}
	if C.gc_error_string(r, &s) == 0 && s != nil {
		desc = ": " + C.GoString(s)
	}
	return fmt.Errorf("%s: %s (%d)%s", call, name, int(r), desc)
}

// cudaBusID turns NVML's PCI bus id ("00000000:3B:00.0") into the form
// cuDeviceGetByPCIBusId takes ("0000:3b:00.0").
func cudaBusID(id string) string {
	id = strings.ToLower(id)
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) > 4 {
		id = dom[len(dom)-4:] + ":" + rest
	}
	return id
}

// Device attributes read (CUdevice_attribute).
const (
	attrMultiprocessors = 16
	attrPCIBus          = 33
	attrPCIDevice       = 34
	attrPCIDomain       = 50
)

// device finds the target's CUDA device and describes it.
func device(t Target) (C.CUdevice, GPUResult, error) {
	var d C.CUdevice
	res := GPUResult{Index: t.Index, PCIBusID: t.PCIBusID}
	if t.PCIBusID != "" {
		bus := C.CString(cudaBusID(t.PCIBusID))
		defer C.free(unsafe.Pointer(bus))
		if err := cuErr("cuDeviceGetByPCIBusId "+cudaBusID(t.PCIBusID), C.gc_device_by_bus(&d, bus)); err != nil {
			return d, res, err
		}
	} else if err := cuErr(fmt.Sprintf("cuDeviceGet %d", t.Index), C.gc_device_get(&d, C.int(t.Index))); err != nil {
		return d, res, err
	}
	var name [256]C.char
	if C.gc_device_name(&name[0], C.int(len(name)), d) == 0 {
		res.Name = C.GoString(&name[0])
	}
	if res.PCIBusID == "" {
		var dom, bus, dev C.int
		if C.gc_device_attr(&dom, attrPCIDomain, d) == 0 && C.gc_device_attr(&bus, attrPCIBus, d) == 0 &&
			C.gc_device_attr(&dev, attrPCIDevice, d) == 0 {
			res.PCIBusID = fmt.Sprintf("%08X:%02X:%02X.0", int(dom), int(bus), int(dev))
		}
	}
	return d, res, nil
}

// deviceCount is the number of CUDA devices the process sees.
func deviceCount() (int, error) {
	var n C.int
	if err := cuErr("cuDeviceGetCount", C.gc_device_count(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// session holds what one GPU's measurement allocated, in its context, to free it in
// reverse order.
type session struct {
	sms     int
	dev     []C.CUdeviceptr
	host    []unsafe.Pointer
	modules []C.CUmodule
}

func (s *session) free() {
	for _, p := range s.dev {
		C.gc_mem_free(p)
	}
	for _, p := range s.host {
		C.gc_host_free(p)
	}
	for _, m := range s.modules {
		C.gc_module_unload(m)
	}
}

// load JIT-compiles a PTX module and returns its entry; a JIT failure carries the
// compiler's log.
func (s *session) load(ptx, entry string) (C.CUfunction, error) {
	text := C.CString(ptx)
	defer C.free(unsafe.Pointer(text))
	const logSize = 16 << 10
	log := (*C.char)(C.malloc(logSize))
	defer C.free(unsafe.Pointer(log))
	var m C.CUmodule
	if err := cuErr("cuModuleLoadDataEx", C.gc_load(&m, text, log, logSize)); err != nil {
		return nil, fmt.Errorf("JIT of the PTX of %s: %w; JIT log: %s", entry, err, strings.TrimSpace(C.GoString(log)))
	}
	s.modules = append(s.modules, m)
	name := C.CString(entry)
	defer C.free(unsafe.Pointer(name))
	var f C.CUfunction
	if err := cuErr("cuModuleGetFunction "+entry, C.gc_module_function(&f, m, name)); err != nil {
		return nil, err
	}
	return f, nil
}

func (s *session) alloc(n int64) (C.CUdeviceptr, error) {
	var p C.CUdeviceptr
	if err := cuErr(fmt.Sprintf("cuMemAlloc_v2 %d MiB", n>>20), C.gc_mem_alloc(&p, C.size_t(n))); err != nil {
		return 0, err
	}
	s.dev = append(s.dev, p)
	return p, nil
}

// hostAlloc allocates pinned (page-locked) host memory, which the GPU's copy engines
// reach by DMA; pageable memory would measure the CPU's staging copy instead.
func (s *session) hostAlloc(n int64) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	if err := cuErr(fmt.Sprintf("cuMemAllocHost_v2 %d MiB", n>>20), C.gc_host_alloc(&p, C.size_t(n))); err != nil {
		return nil, err
	}
	s.host = append(s.host, p)
	return p, nil
}

// timed runs step iters times on the default stream between two events and returns
// the GPU time in seconds.
func (s *session) timed(iters int, step func(i int) error) (float64, error) {
	var start, stop C.CUevent
	if err := cuErr("cuEventCreate", C.gc_event_create(&start)); err != nil {
		return 0, err
	}
	defer C.gc_event_destroy(start)
	if err := cuErr("cuEventCreate", C.gc_event_create(&stop)); err != nil {
		return 0, err
	}
	defer C.gc_event_destroy(stop)
	if err := cuErr("cuEventRecord", C.gc_event_record(start)); err != nil {
		return 0, err
	}
	for i := 0; i < iters; i++ {
		if err := step(i); err != nil {
			return 0, err
		}
	}
	if err := cuErr("cuEventRecord", C.gc_event_record(stop)); err != nil {
		return 0, err
	}
	if err := cuErr("cuEventSynchronize", C.gc_event_sync(stop)); err != nil {
		return 0, err
	}
	var ms C.float
	if err := cuErr("cuEventElapsedTime", C.gc_event_elapsed(&ms, start, stop)); err != nil {
		return 0, err
	}
	if ms <= 0 {
		return 0, fmt.Errorf("cuEventElapsedTime: %g ms for %d iterations", float64(ms), iters)
	}
	return float64(ms) / 1e3, nil
}

// measureGPU measures one GPU in a context of its own, on a locked OS thread (a CUDA
// context is current to a thread).
func measureGPU(t Target, o Options) GPUResult {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, res, err := device(t)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	var ctx C.CUcontext
	if err := cuErr("cuCtxCreate_v2", C.gc_ctx_create(&ctx, d)); err != nil {
		res.Err = err.Error()
		return res
	}
	defer C.gc_ctx_destroy(ctx)
	var sms C.int
	if C.gc_device_attr(&sms, attrMultiprocessors, d) != 0 || sms < 1 {
		sms = 1
	}
	s := &session{sms: int(sms)}
	defer s.free()
	f := &Figures{SGEMMN: o.N}
	if err := s.sgemm(o, f); err != nil {
		res.Err = err.Error()
		return res
	}
	if err := s.bandwidth(o, f); err != nil {
		res.Err = err.Error()
		return res
	}
	res.Figures = f
	return res
}

// sgemm times Iterations launches of the tiled SGEMM on N×N matrices after one
// warm-up, and verifies a sample of C against the CPU.
func (s *session) sgemm(o Options, f *Figures) error {
	fn, err := s.load(SGEMMPTX, "sgemm_tiled")
	if err != nil {
		return err
	}
	n := o.N
	bytes := int64(n) * int64(n) * 4
	var dev [3]C.CUdeviceptr
	var host [3]unsafe.Pointer
	for i := range dev {
		if dev[i], err = s.alloc(bytes); err != nil {
			return err
		}
		if host[i], err = s.hostAlloc(bytes); err != nil {
			return err
		}
	}
	a := unsafe.Slice((*float32)(host[0]), n*n)
	b := unsafe.Slice((*float32)(host[1]), n*n)
	c := unsafe.Slice((*float32)(host[2]), n*n)
	FillMatrix(a, 1)
	FillMatrix(b, 2)
	clear(c)
	for i := 0; i < 2; i++ {
		if err := cuErr("cuMemcpyHtoD_v2", C.gc_htod(dev[i], host[i], C.size_t(bytes))); err != nil {
			return err
		}
	}
	launch := func(int) error {
		return cuErr("cuLaunchKernel sgemm_tiled", C.gc_launch_sgemm(fn, dev[0], dev[1], dev[2], C.uint(n)))
	}
	if err := launch(0); err != nil {
		return err
	}
	if err := cuErr("cuCtxSynchronize after sgemm_tiled", C.gc_ctx_sync()); err != nil {
		return err
	}
	secs, err := s.timed(o.Iterations, launch)
	if err != nil {
		return err
	}
	f.TFLOPSFP32 = 2 * float64(n) * float64(n) * float64(n) * float64(o.Iterations) / secs / 1e12
	if err := cuErr("cuMemcpyDtoH_v2", C.gc_dtoh(host[2], dev[2], C.size_t(bytes))); err != nil {
		return err
	}
	entries := SampleEntries(n, 64)
	f.SGEMMSamples = len(entries)
	f.SGEMMMaxError, err = Verify(a, b, c, n, entries)
	f.SGEMMVerified = err == nil
	if err != nil {
		f.VerifyError = err.Error()
	}
	return nil
}

// bandwidth measures pinned host→device copies (which also fill the copy kernel's
// source), the copy kernel's device-memory rate, and device→host copies of its
// destination, whose content is then checked.
func (s *session) bandwidth(o Options, f *Figures) error {
	fn, err := s.load(CopyPTX, "copy_f4")
	if err != nil {
		return err
	}
	src, err := s.alloc(o.CopyBytes)
	if err != nil {
		return err
	}
	dst, err := s.alloc(o.CopyBytes)
	if err != nil {
		return err
	}
	hp, err := s.hostAlloc(o.TransferBytes)
	if err != nil {
		return err
	}
	host := unsafe.Slice((*uint32)(hp), o.TransferBytes/4)
	FillPattern(host)
	chunks := o.CopyBytes / o.TransferBytes
	chunk := func(i int) C.CUdeviceptr { return C.CUdeviceptr(int64(i) % chunks * o.TransferBytes) }
	secs, err := s.timed(o.Iterations, func(i int) error {
		return cuErr("cuMemcpyHtoDAsync_v2", C.gc_htod_async(src+chunk(i), hp, C.size_t(o.TransferBytes)))
	})
	if err != nil {
		return err
	}
	f.H2DGBps = float64(o.TransferBytes) * float64(o.Iterations) / secs / 1e9
	blocks := C.uint(s.sms * 8)
	launch := func(int) error {
		return cuErr("cuLaunchKernel copy_f4", C.gc_launch_copy(fn, blocks, dst, src, C.ulonglong(o.CopyBytes/16)))
	}
	if err := launch(0); err != nil {
		return err
	}
	if err := cuErr("cuCtxSynchronize after copy_f4", C.gc_ctx_sync()); err != nil {
		return err
	}
	if secs, err = s.timed(o.Iterations, launch); err != nil {
		return err
	}
	f.DeviceGBps = 2 * float64(o.CopyBytes) * float64(o.Iterations) / secs / 1e9
	clear(host)
	secs, err = s.timed(o.Iterations, func(i int) error {
		return cuErr("cuMemcpyDtoHAsync_v2", C.gc_dtoh_async(hp, dst+chunk(i), C.size_t(o.TransferBytes)))
	})
	if err != nil {
		return err
	}
	f.D2HGBps = float64(o.TransferBytes) * float64(o.Iterations) / secs / 1e9
	if err := CheckPattern(host); err != nil {
		f.VerifyError = strings.TrimPrefix(f.VerifyError+"; ", "; ") + "device copy: " + err.Error()
	} else {
		f.CopyVerified = true
	}
	return nil
}
