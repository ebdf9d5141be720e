package adaptive_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/adaptive"
)

// A Rate in a Policy paces a client once the server throttles.
func Example() {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	rate := &adaptive.Rate{}
	c := &idemhttp.Client{Policy: &idemhttp.Policy{Pacer: rate, BaseDelay: time.Millisecond}}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"amount":1000}`))
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	_, pacing := rate.Limit()
	fmt.Println(resp.StatusCode, "pacing:", pacing)
	// Output: 201 pacing: true
}
