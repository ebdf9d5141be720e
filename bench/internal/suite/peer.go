package suite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemkit/idemhttp"
)

// The peers, in table order.
const (
	PeerRaw       = "raw"           // net/http, one attempt, no key
	PeerRetryable = "retryablehttp" // go-retryablehttp with its defaults
	PeerStripe    = "stripe-go"     // stripe-go v82, MaxNetworkRetries 3
	PeerIdem      = "idemhttp"      // idemhttp with DefaultPolicy

	// PeerRawKey is raw net/http sending a fresh Idempotency-Key on every
	// request: not a client anyone would pick, but a control that makes the
	// server do the same keyed work as the keyed peers, so Overhead can
	// tell the client's cost from the server's.
	PeerRawKey = "raw+key"
)

// Peers returns every peer name, in table order.
func Peers() []string { return []string{PeerRaw, PeerRetryable, PeerStripe, PeerIdem} }

// chargesPath is the endpoint every peer posts to: the one stripe-go's
// V1Charges.Create uses.
const chargesPath = "/v1/charges"

// Sender sends one operation and reports how it ended: the final status
// (0 with a non-nil error when no response came back) and the error the
// client reported. A 2xx status with a nil error is success. body is the
// form-encoded request body (see [Body]); a client that builds its own
// body from parameters (stripe-go) builds the same fields instead.
type Sender interface {
	Send(ctx context.Context, op string, body []byte) (status int, err error)
}

// Body returns the form body of op: a 10.00 USD charge whose
// metadata[operation] names op, as stripe-go encodes it.
func Body(op string) []byte {
	return []byte("amount=1000&currency=usd&metadata[operation]=" + url.QueryEscape(op))
}

// peerConfig configures a peer's client.
type peerConfig struct {
	url     string           // server base URL
	timeout time.Duration    // http.Client.Timeout: bounds one attempt
	count   bool             // wrap the transport to count attempts and resends
	journal idemhttp.Journal // idemhttp only: nil for none
	withOp  bool             // idemhttp only: name the operation (WithOperation)
}

// peer is a Sender with the transport it owns.
type peer struct {
	name string
	Sender
	idem      *idemhttp.Client // set for idemhttp, for Resume
	hc        *http.Client     // every attempt goes through it
	transport *http.Transport
}

// close releases the peer's pooled connections.
func (p *peer) close() { p.transport.CloseIdleConnections() }

// newTransport returns the transport every peer gets: the same settings,
// a pool of its own, so that one peer's dead connections never reach the
// next.
func newTransport() *http.Transport {
	return &http.Transport{
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
}

// newPeer builds the named peer.
func newPeer(name string, cfg peerConfig) (*peer, error) {
	t := newTransport()
	var rt http.RoundTripper = t
	if cfg.count {
		rt = countingTransport{t}
	}
	// One http.Client per peer, shared by all its calls; its Timeout bounds
	// each attempt, as a per-attempt timeout does in every peer.
	hc := &http.Client{Transport: rt, Timeout: cfg.timeout}
	p := &peer{name: name, hc: hc, transport: t}
	target := cfg.url + chargesPath
	switch name {
	case PeerRaw:
		p.Sender = rawSender{hc: hc, url: target}
	case PeerRawKey:
		p.Sender = rawSender{hc: hc, url: target, key: true}
	case PeerRetryable:
		rc := retryablehttp.NewClient()
		// Its defaults (4 retries, 1 s to 30 s backoff, DefaultRetryPolicy)
		// except the logger, which would print every request to stderr.
		rc.HTTPClient, rc.Logger = hc, nil
		p.Sender = retryableSender{rc: rc, url: target}
	case PeerStripe:
		backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
			HTTPClient:        hc,
			URL:               stripe.String(cfg.url),
			MaxNetworkRetries: stripe.Int64(3),
			LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		})
		p.Sender = stripeSender{sc: stripe.NewClient("sk_test_idembench", stripe.WithBackends(backends))}
	case PeerIdem:
		c := &idemhttp.Client{HTTPClient: hc, Journal: cfg.journal}
		p.idem = c
		p.Sender = idemSender{c: c, url: target, withOp: cfg.withOp}
	default:
		return nil, fmt.Errorf("unknown peer %q (want one of %v)", name, Peers())
	}
	return p, nil
}

// formType is the Content-Type of every body.
const formType = "application/x-www-form-urlencoded"

// rawSender is net/http: one attempt, no key.
type rawSender struct {
	hc  *http.Client
	url string
	key bool // send a fresh Idempotency-Key
}

func (s rawSender) Send(ctx context.Context, _ string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", formType)
	if s.key {
		req.Header.Set(idemhttp.DefaultKeyHeader, idemhttp.NewKey())
	}
	return finish(s.hc.Do(req))
}

// retryableSender is go-retryablehttp.
type retryableSender struct {
	rc  *retryablehttp.Client
	url string
}

func (s retryableSender) Send(ctx context.Context, _ string, body []byte) (int, error) {
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, s.url, body)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", formType)
	return finish(s.rc.Do(req))
}

// stripeSender is stripe-go: it builds and encodes the same fields itself,
// with an Idempotency-Key of its own per call.
type stripeSender struct{ sc *stripe.Client }

func (s stripeSender) Send(ctx context.Context, op string, _ []byte) (int, error) {
	params := &stripe.ChargeCreateParams{Amount: stripe.Int64(1000), Currency: stripe.String(string(stripe.CurrencyUSD))}
	params.AddMetadata("operation", op)
	ch, err := s.sc.V1Charges.Create(ctx, params)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) {
			return se.HTTPStatusCode, err
		}
		return 0, err
	}
	if ch.LastResponse == nil {
		return http.StatusOK, nil
	}
	return ch.LastResponse.StatusCode, nil
}

// idemSender is idemhttp.
type idemSender struct {
	c      *idemhttp.Client
	url    string
	withOp bool
}

func (s idemSender) Send(ctx context.Context, op string, body []byte) (int, error) {
	if s.withOp {
		ctx = idemhttp.WithOperation(ctx, op)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", formType)
	resp, err := s.c.Do(req)
	var done *idemhttp.DoneError
	if errors.As(err, &done) {
		return done.Status, nil // done in the journal: nothing sent
	}
	return finish(resp, err)
}

// finish reads and closes a response, as every caller that reuses
// connections must, and returns its status.
func finish(resp *http.Response, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}
