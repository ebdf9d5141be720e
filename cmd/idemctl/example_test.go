package main

import (
	"fmt"
	"net/url"
	"strings"
)

// A JSON body sent with -body-format form, encoded as Stripe reads forms.
func Example_formBody() {
	b, err := formFromJSON([]byte(`{"amount":1000,"currency":"usd","metadata":{"order":"o-1"},"expand":["balance_transaction"]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	v, _ := url.QueryUnescape(string(b))
	fmt.Println(v)
	// Output: amount=1000&currency=usd&expand[0]=balance_transaction&metadata[order]=o-1
}

// A CSV input: the header names the columns; the field columns become the
// body, here a form.
func Example_csvInput() {
	base, _ := url.Parse("https://api.example.com/v1/charges")
	in := "id,amount,currency,metadata[order]\ncharge-0001,1000,usd,o-1\ncharge-0002,2500,eur,\n"
	ops, bad, err := readInputAs(strings.NewReader(in), base, inputSpec{format: formatCSV, body: bodyForm})
	if err != nil || len(bad) > 0 {
		fmt.Println(err, bad)
		return
	}
	for _, op := range ops {
		fmt.Printf("line %d: %s %s %s %s\n", op.Line, op.ID, op.Method, op.URL, op.Body)
	}
	// Output:
	// line 2: charge-0001 POST https://api.example.com/v1/charges amount=1000&currency=usd&metadata%5Border%5D=o-1
	// line 3: charge-0002 POST https://api.example.com/v1/charges amount=2500&currency=eur
}
