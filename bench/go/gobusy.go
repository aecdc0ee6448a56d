// wr-gobusy: the busy Go program of scripts/bench's agent section (built at bench time with
// Debian's golang).
//
//	wr-gobusy SECONDS GOROUTINES
//
// GOROUTINES goroutines spin on arithmetic (no function call in the inner loop, so only the
// runtime's asynchronous preemption can take the CPU from them) until SECONDS have passed.
// With more goroutines than GOMAXPROCS, sysmon preempts each one that ran 10 ms with a SIGURG
// (tgkill), the signal load of every Go service (kubelet, containerd, dockerd). Prints one line:
//
//	pid=... goroutines=... loops=... wall_s=...
package main

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil {
		panic(err)
	}
	n, err := strconv.Atoi(os.Args[2])
	if err != nil {
		panic(err)
	}
	start := time.Now()
	deadline := start.Add(time.Duration(seconds * 1e9))
	var loops atomic.Uint64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(x uint64) {
			defer wg.Done()
			for time.Now().Before(deadline) {
				for k := 0; k < 1<<20; k++ {
					x = x*6364136223846793005 + 1442695040888963407
				}
				loops.Add(1)
			}
			if x == 42 { // (keeps the loop from being optimised away)
				fmt.Fprintln(os.Stderr, x)
			}
		}(uint64(i))
	}
	wg.Wait()
	fmt.Printf("pid=%d goroutines=%d loops=%d wall_s=%.3f\n", os.Getpid(), n, loops.Load(),
		time.Since(start).Seconds())
}
