package netnstest

// sysSetns is setns(2)'s number; package syscall lacks SYS_SETNS on 386.
const sysSetns = 346
