// Package netnstest builds throwaway Linux network topologies for tests:
// network namespaces, veth pairs, bridges and tap devices, created with the
// ip tool from iproute2 and deleted again by t.Cleanup, even when the test
// fails or panics.
//
// It is for integration tests that need real sockets on real (virtual)
// links: a DHCP or TFTP server answering on a bridge, an agent talking to a
// control plane across a veth pair, QEMU attached to a tap device. Every
// namespace and link name starts with "gpr-" followed by a random per-Env
// suffix, so parallel tests and packages do not collide, and anything left
// behind by a killed test binary is easy to spot in `ip netns list`.
//
// It is not a general network configuration library: it does not program
// routes, firewall rules or sysctls, it shells out to ip(8) instead of
// speaking netlink, and it is not meant for production code. It needs
// Linux, root and the ip tool; Require skips a test (saying why) when they
// are missing.
//
// A typical test:
//
//	env := netnstest.New(t)
//	server, client := env.Namespace(), env.Namespace()
//	s, c := env.Veth(server, client)
//	env.AddAddr(s, "192.0.2.1/24")
//	env.AddAddr(c, "192.0.2.2/24")
//	cmd := env.Command(server, serverBinary, "-listen", "192.0.2.1:8080")
//	// cmd.Start(), then netnstest.WaitPortIn(ctx, server, "tcp", "192.0.2.1:8080")
//
// Setup methods on Env call t.Fatal on failure and must be called from the
// test's own goroutine, like t.Fatal itself.
package netnstest
