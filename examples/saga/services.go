package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemtest"
)

// services are the three fake APIs a job calls, each behind
// idemserver.Middleware (keys required, responses stored and replayed,
// as Stripe does), each counting the requests it receives and the effects
// it executes per operation, so that a test can check that every effect
// ran exactly once.
type services struct {
	payments, inventory, mailer *service
}

// newServices starts the services on loopback ports. inStock is the
// stock of each SKU; a SKU not listed has none.
func newServices(inStock map[string]int) *services {
	s := &services{
		payments:  newService("payments"),
		inventory: newService("inventory"),
		mailer:    newService("mailer"),
	}
	s.inventory.stock = maps.Clone(inStock)
	s.payments.handle("POST /v1/charges", s.payments.charge)
	s.payments.handle("POST /v1/refunds", s.payments.refund)
	s.inventory.handle("POST /v1/reservations", s.inventory.reserve)
	s.mailer.handle("POST /v1/receipts", s.mailer.receipt)
	for _, sv := range s.all() {
		sv.start()
	}
	return s
}

func (s *services) all() []*service { return []*service{s.payments, s.inventory, s.mailer} }

// urls returns the services' base URLs.
func (s *services) urls() Services {
	return Services{Payments: s.payments.url, Inventory: s.inventory.url, Mailer: s.mailer.url}
}

// close shuts the services down.
func (s *services) close() {
	for _, sv := range s.all() {
		sv.srv.Close()
	}
}

// counts returns what the services saw, per operation (job/step).
func (s *services) counts() counts {
	c := counts{requests: map[string]int{}, effects: map[string]int{}, created: map[string]string{}, used: map[string]params{}}
	for _, sv := range s.all() {
		sv.mu.Lock()
		maps.Copy(c.requests, sv.requests)
		maps.Copy(c.effects, sv.effects)
		maps.Copy(c.created, sv.created)
		maps.Copy(c.used, sv.used)
		sv.mu.Unlock()
	}
	return c
}

// counts are what the services saw and did, per operation.
type counts struct {
	requests map[string]int    // requests received
	effects  map[string]int    // effects executed
	created  map[string]string // the id each effect created
	used     map[string]params // the parameters each effect ran with
}

// service is one fake API. Safe for concurrent use.
type service struct {
	name string
	mux  *http.ServeMux
	srv  *httptest.Server
	url  string

	mu       sync.Mutex
	requests map[string]int    // per operation, replays and refusals included
	effects  map[string]int    // per operation: the side effects executed
	created  map[string]string // per operation: the id of the object its effect created
	used     map[string]params // per operation: the parameters its effect ran with
	// dropAnswers, while positive, makes the service run a request and
	// then close the connection without answering, counting down: the
	// effect happened, the client cannot know.
	dropAnswers int
	seq         int
	stock       map[string]int   // inventory: units left per SKU
	charges     map[string]int64 // payments: amount per charge id
	refunded    map[string]bool  // payments: charge ids refunded
}

func newService(name string) *service {
	return &service{
		name: name, mux: http.NewServeMux(),
		requests: map[string]int{}, effects: map[string]int{}, created: map[string]string{}, used: map[string]params{},
		charges: map[string]int64{}, refunded: map[string]bool{},
	}
}

// handle serves pattern with h behind the idempotency middleware.
func (sv *service) handle(pattern string, h http.HandlerFunc) {
	mw := &idemserver.Middleware{SingleTenant: true, Required: true, Store: &idemserver.MemoryStore{}, RetryAfter: -1}
	sv.mux.Handle(pattern, mw.Wrap(h))
}

// start listens on a loopback port; every request is counted by its
// operation before the middleware sees it.
func (sv *service) start() {
	sv.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "unreadable body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		sv.mu.Lock()
		sv.requests[idemtest.Operation(r.Header.Get("Content-Type"), body)]++
		drop := sv.dropAnswers > 0
		if drop {
			sv.dropAnswers--
		}
		sv.mu.Unlock()
		if !drop {
			sv.mux.ServeHTTP(w, r)
			return
		}
		sv.mux.ServeHTTP(httptest.NewRecorder(), r) // runs, and the answer is lost
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	}))
	sv.url = sv.srv.URL
}

// params is the JSON body every endpoint takes.
type params struct {
	Operation   string `json:"operation"` // job/step: names the effect for the counts
	Amount      int64  `json:"amount,omitempty"`
	Currency    string `json:"currency,omitempty"`
	Charge      string `json:"charge,omitempty"`
	SKU         string `json:"sku,omitempty"`
	Quantity    int    `json:"quantity,omitempty"`
	Reservation string `json:"reservation,omitempty"`
	Email       string `json:"email,omitempty"`
}

func readParams(w http.ResponseWriter, r *http.Request) (params, bool) {
	var p params
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Operation == "" {
		problem(w, http.StatusBadRequest, "invalid-request", "Invalid request", "want a JSON object naming its operation")
		return p, false
	}
	return p, true
}

// effect records one side effect of the request p and returns the id of
// the object it creates. The caller holds sv.mu.
func (sv *service) effect(p params, prefix string) string {
	sv.effects[p.Operation]++
	sv.seq++
	id := fmt.Sprintf("%s_%06d", prefix, sv.seq)
	sv.created[p.Operation], sv.used[p.Operation] = id, p
	return id
}

func (sv *service) charge(w http.ResponseWriter, r *http.Request) {
	p, ok := readParams(w, r)
	if !ok {
		return
	}
	if p.Amount <= 0 || p.Currency == "" {
		problem(w, http.StatusBadRequest, "invalid-request", "Invalid request", "amount and currency are required")
		return
	}
	sv.mu.Lock()
	id := sv.effect(p, "ch")
	sv.charges[id] = p.Amount
	sv.mu.Unlock()
	reply(w, map[string]any{"id": id, "object": "charge", "amount": p.Amount, "currency": p.Currency, "status": "succeeded"})
}

func (sv *service) refund(w http.ResponseWriter, r *http.Request) {
	p, ok := readParams(w, r)
	if !ok {
		return
	}
	sv.mu.Lock()
	defer sv.mu.Unlock()
	amount, known := sv.charges[p.Charge]
	switch {
	case !known:
		problem(w, http.StatusNotFound, "no-such-charge", "No such charge", "no charge "+p.Charge)
		return
	case sv.refunded[p.Charge]:
		problem(w, http.StatusConflict, "already-refunded", "Charge already refunded", p.Charge+" was refunded already")
		return
	}
	sv.refunded[p.Charge] = true
	id := sv.effect(p, "re")
	reply(w, map[string]any{"id": id, "object": "refund", "charge": p.Charge, "amount": amount, "status": "succeeded"})
}

func (sv *service) reserve(w http.ResponseWriter, r *http.Request) {
	p, ok := readParams(w, r)
	if !ok {
		return
	}
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if p.Quantity < 1 || sv.stock[p.SKU] < p.Quantity {
		// A definite, stored answer: every retry with the key gets it
		// replayed, so the job may compensate.
		problem(w, http.StatusConflict, "out-of-stock", "Out of stock", fmt.Sprintf("%d of %s wanted, %d left", p.Quantity, p.SKU, sv.stock[p.SKU]))
		return
	}
	sv.stock[p.SKU] -= p.Quantity
	id := sv.effect(p, "rs")
	reply(w, map[string]any{"id": id, "object": "reservation", "sku": p.SKU, "quantity": p.Quantity})
}

func (sv *service) receipt(w http.ResponseWriter, r *http.Request) {
	p, ok := readParams(w, r)
	if !ok {
		return
	}
	if p.Charge == "" || p.Reservation == "" || !strings.Contains(p.Email, "@") {
		problem(w, http.StatusBadRequest, "invalid-request", "Invalid request", "charge, reservation and email are required")
		return
	}
	sv.mu.Lock()
	id := sv.effect(p, "rc")
	sv.mu.Unlock()
	reply(w, map[string]any{"id": id, "object": "receipt", "charge": p.Charge, "reservation": p.Reservation, "to": p.Email})
}

// outOfStockType is the problem type of an inventory refusal.
const outOfStockType = "https://example.com/problems/out-of-stock"

func problem(w http.ResponseWriter, status int, typ, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "https://example.com/problems/" + typ, "title": title, "status": status, "detail": detail})
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
