package netnstest

// sysSetns is setns(2)'s number; package syscall lacks SYS_SETNS on amd64.
const sysSetns = 308
