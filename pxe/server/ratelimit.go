package server

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/enroll"
)

// maxSources bounds how many sources the rate limiter tracks at once. A source whose
// bucket has refilled is forgotten (a new bucket is the same), so only sources that
// called within the last burst/rate seconds count.
const maxSources = 1 << 16

// sourceLimiter is a token bucket per source address for the enrollment calls anyone
// who reaches the TLS port may make (limitedMethods). IPv4 sources count per address,
// IPv6 per /64 (one host usually holds a whole /64).
type sourceLimiter struct {
	limit rate.Limit
	burst int
	now   func() time.Time

	mu        sync.Mutex
	buckets   map[netip.Prefix]*rate.Limiter
	lastSweep time.Time
}

func newSourceLimiter(perSecond float64, burst int) *sourceLimiter {
	return &sourceLimiter{limit: rate.Limit(perSecond), burst: burst, now: time.Now, buckets: map[netip.Prefix]*rate.Limiter{}}
}

// limitedMethods are the calls the limiter applies to: every EnrollmentService call,
// since each may come from a caller gpuboot does not know yet and costs a signature
// check and an inventory read or write before it is refused (issue 33). One bucket per
// source serves them all; an agent makes a few calls a minute.
var limitedMethods = map[string]bool{
	bootv1.EnrollmentService_Register_FullMethodName:              true,
	bootv1.EnrollmentService_Heartbeat_FullMethodName:             true,
	bootv1.EnrollmentService_GetJoinBundle_FullMethodName:         true,
	bootv1.EnrollmentService_ReportCommissioning_FullMethodName:   true,
	bootv1.EnrollmentService_RenewAgentCertificate_FullMethodName: true,
}

// sourceKey is the bucket of addr: the address for IPv4, its /64 for IPv6, as the
// enrollment service counts TPM challenges.
func sourceKey(addr netip.Addr) netip.Prefix { return enroll.SourcePrefix(addr) }

// allow takes a token from addr's bucket. It reports false when the bucket is empty,
// or when maxSources other sources hold non-full buckets.
func (l *sourceLimiter) allow(addr netip.Addr) bool {
	key := sourceKey(addr)
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= maxSources {
			l.sweep(now)
			if len(l.buckets) >= maxSources {
				return false
			}
		}
		b = rate.NewLimiter(l.limit, l.burst)
		l.buckets[key] = b
	}
	return b.AllowN(now, 1)
}

// sweep forgets sources whose buckets are full again, at most once a second.
func (l *sourceLimiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < time.Second {
		return
	}
	l.lastSweep = now
	for k, b := range l.buckets {
		if b.TokensAt(now) >= float64(l.burst) {
			delete(l.buckets, k)
		}
	}
}

// sources is how many sources the limiter tracks (for tests).
func (l *sourceLimiter) sources() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// unary is the interceptor: limited methods from a source over its rate get
// ResourceExhausted naming the setting to change.
func (l *sourceLimiter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !limitedMethods[info.FullMethod] {
		return handler(ctx, req)
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return handler(ctx, req)
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return handler(ctx, req)
	}
	if !l.allow(ap.Addr()) {
		return nil, status.Errorf(codes.ResourceExhausted,
			"%s: more than %g calls per second (burst %d) from %s, or calls from more than 65536 sources at once: wait and retry (the bound is enrollment.sourceRate and enrollment.sourceBurst in gpuboot.yaml)",
			info.FullMethod, float64(l.limit), l.burst, sourceKey(ap.Addr()))
	}
	return handler(ctx, req)
}

// grpcServerOptions are the options of gpuboot's gRPC server: the largest message it
// decodes (enroll.MaxMessageBytes; gRPC's default is 4 MiB) and the per-source rate
// limit.
func grpcServerOptions(l *sourceLimiter) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(enroll.MaxMessageBytes),
		grpc.ChainUnaryInterceptor(l.unary),
	}
}
