package main

import "golang.org/x/sys/unix"

// ttyGetAttr is the ioctl that reads a terminal's attributes; it fails on
// anything that is not a terminal (a pipe, a file, /dev/null).
const ttyGetAttr = unix.TCGETS
