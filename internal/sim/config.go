//go:build go1.26

package sim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
)

// Config is one world: its size, and how often each fault strikes. A
// seed draws one (see [ConfigFor]); shrinking a failure edits it (fewer
// operations, fewer faults) and runs it again with the same seed.
// Probabilities are in percent of the chances the fault has: per message
// delivered, per dial, per call of the disk, per point a server passes.
type Config struct {
	Ops     int // operations in the batch
	Dups    int // operations listed twice: two calls of one operation may run at once
	Workers int // calls the batch job runs at once
	Steps   int // the driver's steps before the final recovery

	MaxAttempts int  // Policy.MaxAttempts
	KeepResults bool // Policy.KeepResults
	RefetchDone bool // Policy.RefetchDone
	Concurrent  bool // Resume runs while the batch is rerun, not before
	SDK         int  // percent of calls made through Client.StandardClient, as an SDK would
	Compact     int  // weight of the job compacting its journal (filejournal.Journal.Compact) among the steps

	// The network, per message or dial.
	Refuse      int // a dial refused
	DropReq     int // a request lost: the server never sees it, the client times out
	DropResp    int // a response lost: the server ran, the client times out
	ResetBefore int // the connection reset before the request reaches the server
	ResetAfter  int // the request reaches the server, then the connection resets
	DeadPooled  int // a reused connection found closed by the server: net/http's own resend
	Delay       int // a message held back (then delivered out of order)
	CloseIdle   int // weight of the server closing an idle connection

	// The disk, per call into it, in tenths of a percent.
	WriteErr int // ENOSPC or EIO on a write
	SyncErr  int // EIO on a sync
	OtherErr int // EIO on a truncation, rename, removal, directory sync or create
	Torn     int // what a power cut keeps of unsynced writes: 0 nothing, 1 a sector prefix, 2 a byte prefix
	DirKeep  bool
	NoDSync  bool // the disk offers no O_DSYNC: the log syncs after each write

	// Crashes and the clock.
	ClientCrashes int // client process crashes (a kill or a power cut)
	ServerCrashes int // server process crashes, at any point of a request
	ServerPoint   int // percent at each point a request passes on the server
	Pause         int // percent of handler runs held until the driver lets them go
	ClockJumps    int // jumps of a client machine's clock (or the fleet database's), forward or back
	LongSleep     bool

	// The caller's configuration (issue 32 §1.1).
	Clients       int  // Clients in each process, sharing its journal (a call uses one of them)
	Unnamed       int  // percent of the operations called without WithOperation or a key: the client mints the key, Resume alone protects them after a crash
	SDKKey        bool // named calls carry an Idempotency-Key of their own (an SDK's), which the journal's key overrides on a rerun
	Redirect      int  // percent of the operations whose URL the server redirects (see modeOld...)
	CheckRedirect int  // the caller's CheckRedirect: redirectDefault, redirectLast, redirectRefuse
	Transport     int  // the caller's Transport: transportNetHTTP, transportWrapped, transportProtocol
	Stream        int  // percent of the calls whose body streams from a reader GetBody can make again
	Panic         int  // permille of the callbacks' calls (PrepareRequest, the hooks, the Pacer) that panic
	Block         int  // permille of them that block, 1 to 90 s
	RequireOp     bool // not Policy.AllowUnnamed: unnamed calls refused
	Backoff       bool // Policy.Backoff: linear, 50 ms a retry
	Pace          int  // a Pacer, which refuses this percent of the attempts (0: none)

	// A fleet (issue 32 §1.2).
	Fleet   int // client machines sharing a fleet journal (journaltest.FleetModel); below 2, one machine with a file journal
	Lease   int // the fleet journal's lease, in seconds
	DBFault int // permille of the fleet journal's calls whose connection is lost (before the call, or after its commit)

	// The server (issue 32 §1.3).
	Shell      int // the server core's shell: shellTx, the transactional shell over the modelled database; shellStreamed, idemserver.Middleware over the modelled Store
	Instances  int // server processes up at once, behind one address, on one database (below 2: one)
	Tenants    int // tenants, each the scope of its keys (a Principal); below 2, SingleTenant
	Behave     int // percent of the handler's runs that fail, give up when their client leaves, panic, commit early and go on, or leave their transaction aborted
	StoreFault int // permille of the store's calls (the database's statements) refused, out of memory, their answer lost, or hung
	Partitions int // the store cut off for a while, every call hanging
	StoreJumps int // jumps of the store's (the database's) clock
	ProcJumps  int // jumps of a server process's own clock (server_clock.go)
	Hijack     int // percent of the handler's runs that hijack the connection or switch protocols (hijack.go)
}

// ConfigFor draws the world of seed: small (a failure is easier to read
// in a small world, and small worlds are fast), with each fault on in
// about half of the seeds and at a strength drawn anew (swarm testing:
// a seed without resets finds what resets would hide).
func ConfigFor(seed uint64) Config {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	on := func(lo, hi int) int {
		if r.IntN(2) == 0 {
			return 0
		}
		return lo + r.IntN(hi-lo+1)
	}
	c := Config{
		Ops:         1 + r.IntN(5),
		Workers:     1 + r.IntN(3),
		Steps:       30 + r.IntN(90),
		MaxAttempts: 2 + r.IntN(3),
		KeepResults: r.IntN(2) == 0,
		RefetchDone: r.IntN(3) == 0,
		Concurrent:  r.IntN(2) == 0,
		SDK:         on(20, 80),
		Compact:     on(1, 3),

		Refuse:      on(5, 40),
		DropReq:     on(3, 20),
		DropResp:    on(3, 25),
		ResetBefore: on(3, 20),
		ResetAfter:  on(3, 30),
		DeadPooled:  on(5, 40),
		Delay:       on(5, 40),
		CloseIdle:   on(1, 4),

		WriteErr: on(5, 60),
		SyncErr:  on(5, 60),
		OtherErr: on(5, 40),
		Torn:     r.IntN(3),
		DirKeep:  r.IntN(2) == 0,
		NoDSync:  r.IntN(4) == 0,

		ClientCrashes: r.IntN(4),
		ServerCrashes: r.IntN(3),
		ServerPoint:   on(5, 30),
		Pause:         on(10, 60),
		ClockJumps:    on(1, 2),
		LongSleep:     r.IntN(20) == 0,
	}
	c.Dups = r.IntN(c.Ops + 1)
	// Drawn after the first worlds' fields, from a stream of their own,
	// so that adding one leaves the others' draws alone.
	r = rand.New(rand.NewPCG(seed, 0xca11e7))
	c.Clients = 1 + r.IntN(2)
	c.Unnamed = on(20, 60)
	c.SDKKey = r.IntN(2) == 0
	c.Redirect = on(20, 80)
	c.CheckRedirect = r.IntN(numRedirectPolicy)
	c.Transport = r.IntN(numTransports)
	c.Stream = on(20, 80)
	c.Panic = on(5, 60)
	c.Block = on(5, 40)
	c.RequireOp = r.IntN(4) == 0
	c.Backoff = r.IntN(2) == 0
	c.Pace = on(5, 30)
	if r.IntN(3) == 0 {
		c.Fleet = 2 + r.IntN(2)
		c.Lease = 5 + r.IntN(56)
		c.DBFault = on(5, 40)
	}
	r = rand.New(rand.NewPCG(seed, 0x5e4e4))
	c.Shell = r.IntN(numShells)
	c.Instances = 1 + r.IntN(2)
	c.Tenants = 1 + r.IntN(3)
	c.Behave = on(10, 40)
	c.StoreFault = on(20, 150)
	c.Partitions = on(1, 2)
	c.StoreJumps = on(1, 2)
	// The server process's clock and hijacking handlers, from a stream
	// of their own (as above).
	r = rand.New(rand.NewPCG(seed, 0x5e4c10c))
	c.ProcJumps = on(1, 3)
	c.Hijack = on(5, 30)
	return c
}

// String is the form ParseConfig reads: every field, name=value.
func (c Config) String() string {
	v := reflect.ValueOf(c)
	var b strings.Builder
	for i := range v.NumField() {
		if i > 0 {
			b.WriteByte(',')
		}
		f := v.Field(i)
		b.WriteString(strings.ToLower(v.Type().Field(i).Name))
		b.WriteByte('=')
		switch f.Kind() {
		case reflect.Bool:
			b.WriteString(strconv.FormatBool(f.Bool()))
		default:
			b.WriteString(strconv.FormatInt(f.Int(), 10))
		}
	}
	return b.String()
}

// ParseConfig reads what String writes onto base: fields not named keep
// base's values.
func ParseConfig(base Config, s string) (Config, error) {
	v := reflect.ValueOf(&base).Elem()
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return base, fmt.Errorf("sim config: %q is not name=value", kv)
		}
		f := v.FieldByNameFunc(func(n string) bool { return strings.EqualFold(n, k) })
		if !f.IsValid() {
			return base, fmt.Errorf("sim config: no field %q", k)
		}
		switch f.Kind() {
		case reflect.Bool:
			b, err := strconv.ParseBool(val)
			if err != nil {
				return base, fmt.Errorf("sim config: %s: %w", k, err)
			}
			f.SetBool(b)
		default:
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return base, fmt.Errorf("sim config: %s: %w", k, err)
			}
			f.SetInt(n)
		}
	}
	return base, nil
}
