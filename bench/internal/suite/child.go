package suite

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idemhttp/idemtest"
)

// Child processes are this same program started again with envChild set
// to their role and envConfig holding their configuration as JSON.
const (
	envChild  = "IDEMBENCH_CHILD"
	envConfig = "IDEMBENCH_CHILD_CONFIG"

	roleCrash  = "crash-batch" // a batch process that is SIGKILLed mid-batch
	roleServer = "server"      // an idemtest server for Overhead
)

// MaybeRunChild runs the child role this process was started for, if any,
// and exits; in any other process it returns at once. Call it first thing
// in main, and in TestMain before anything else.
func MaybeRunChild() {
	role := os.Getenv(envChild)
	if role == "" {
		return
	}
	var code int
	switch role {
	case roleCrash:
		code = crashChild(os.Getenv(envConfig))
	case roleServer:
		code = serverChild()
	default:
		fmt.Fprintf(os.Stderr, "idembench: unknown child role %q\n", role)
		code = 2
	}
	os.Exit(code)
}

// childCommand returns a command that runs this program again in role,
// with cfg passed as JSON.
func childCommand(ctx context.Context, role string, cfg any) (*exec.Cmd, error) {
	if os.Getenv(envChild) != "" {
		// A program that forgot MaybeRunChild would otherwise start
		// itself over and over.
		return nil, errors.New("already a child process: call suite.MaybeRunChild first in main or TestMain")
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	// -test.run=^$ keeps a test binary that ignores the role from running
	// its tests again; MaybeRunChild exits before flags are parsed.
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+role, envConfig+"="+string(b))
	return cmd, nil
}

// serverChild serves an idemtest server without faults, prints its URL
// on stdout, and serves until stdin closes, answering each line read from
// stdin with the CPU time the process has used so far, in nanoseconds.
func serverChild() int {
	srv := idemtest.NewServer(nil)
	defer srv.Close()
	fmt.Println(srv.URL)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fmt.Println(int64(processCPU()))
	}
	return 0
}

// ChildServer is an idemtest server running in a child process, so that
// its work and its allocations are not the measured client's.
type ChildServer struct {
	URL    string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
}

// CPU returns the CPU time the server process has used so far. It must
// not be called concurrently.
func (s *ChildServer) CPU() (time.Duration, error) {
	if _, err := io.WriteString(s.stdin, "cpu\n"); err != nil {
		return 0, err
	}
	line, err := s.stdout.ReadString('\n')
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	return time.Duration(ns), err
}

// StartServer starts an idemtest server without faults in a child
// process and returns once it listens. Close stops it.
func StartServer(ctx context.Context) (*ChildServer, error) {
	cmd, err := childCommand(ctx, roleServer, nil)
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil {
		_ = stdin.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("start server: read its URL: %w", err)
	}
	return &ChildServer{URL: strings.TrimSpace(line), cmd: cmd, stdin: stdin, stdout: out}, nil
}

// Close stops the server and waits for its process to exit.
func (s *ChildServer) Close() error {
	_ = s.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		_ = s.cmd.Process.Kill()
		return <-done
	}
}
