--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: idemhttp_journal; Type: TABLE; Schema: idemhttp_golden; Owner: -
--

CREATE TABLE idemhttp_golden.idemhttp_journal (
    key text NOT NULL,
    operation text,
    method text NOT NULL,
    url text NOT NULL,
    header jsonb DEFAULT '{}'::jsonb NOT NULL,
    body bytea,
    fingerprint text NOT NULL,
    state text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    last_status integer DEFAULT 0 NOT NULL,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    lease_token text,
    CONSTRAINT idemhttp_journal_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT idemhttp_journal_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'done'::text, 'abandoned'::text])))
);


--
-- Data for Name: idemhttp_journal; Type: TABLE DATA; Schema: idemhttp_golden; Owner: -
--

INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('3479c570-408b-4c8c-8831-945914b4bd5f', 'op-done-201', 'POST', 'http://api.golden.example/v1/charges?currency=usd', '{"X-Multi": ["one", "two"], "Content-Type": ["application/json"], "Stripe-Version": ["2024-06-20"]}', '\x7b22616d6f756e74223a3130302c22646f223a22323031222c226f70223a226f702d646f6e652d323031227d', 'b4061f2f153662ad053ef470a310fcf729e0a7dba24a266baef4a3add1f880d0', 'done', '2026-12-02 03:52:36.17261+00', '2026-12-02 03:52:36.184077+00', 1, 201, NULL, NULL, NULL);
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('dc5a2cae-c5de-48da-8b19-b75ab5cba544', 'op-done-402', 'POST', 'http://api.golden.example/v1/charges?currency=usd', '{"Content-Type": ["application/json"]}', '\x7b22616d6f756e74223a3130302c22646f223a22343032222c226f70223a226f702d646f6e652d343032227d', '7a27c6ac4b0909aa53e9d8d05bed3f7ffbb8527db11aebf2d57c49a7f4fdb98e', 'done', '2026-12-02 03:52:36.189677+00', '2026-12-02 03:52:36.203531+00', 1, 402, NULL, NULL, NULL);
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('4b66e412-a6c0-4ae5-9945-904656fec138', 'op-done-stored-500', 'POST', 'http://api.golden.example/v1/charges?currency=usd', '{"Content-Type": ["application/json"]}', '\x7b22616d6f756e74223a3130302c22646f223a2273746f726564353030222c226f70223a226f702d646f6e652d73746f7265642d353030227d', '81b761189e13f790013d3fad0a785a0daa7b7334d613f6849da0b9865b92fd69', 'done', '2026-12-02 03:52:36.205717+00', '2026-12-02 03:52:36.221309+00', 1, 500, NULL, NULL, NULL);
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('06baa2d4-9890-47a8-a33f-2947b1c90388', 'op-pending-503', 'POST', 'http://api.golden.example/v1/charges?currency=usd', '{"Content-Type": ["application/json"]}', '\x7b22616d6f756e74223a3130302c22646f223a22353033222c226f70223a226f702d70656e64696e672d353033227d', 'ce0431b16f00f66a1461e2e70b0e07551dd12dc8ddea6d36af3ba59e00952602', 'pending', '2026-12-02 03:52:36.237606+00', '2026-12-02 03:52:36.26449+00', 2, 503, 'golden-a', '2026-12-02 03:57:36.237606+00', 'c460aef4930e6da9282fdd7d');
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('20cd84bc-f11d-4b6d-b688-67cf452e8a4b', NULL, 'POST', 'http://api.golden.example/v1/charges', '{}', '\x7b22646f223a22323031222c226f70223a226e6f6e65227d', 'bf0fb41d5bdbd87797e6ff89a995921de9bd6b7205db95fdc0468ec8fdb47f7c', 'done', '2026-12-02 03:52:36.278826+00', '2026-12-02 03:52:36.293851+00', 1, 201, NULL, NULL, NULL);
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('11111111-1111-4111-8111-111111111111', 'op-pending-killed', 'POST', 'http://api.golden.example/v1/charges', '{"Content-Type": ["application/json"]}', '\x7b22646f223a22323031222c226f70223a226f702d70656e64696e672d6b696c6c6564227d', '35ff81dc1a4945da5f1bc954bbb5bcd57da5c0ec36da9889603c746b20524461', 'pending', '2026-12-02 03:52:36.3033+00', '2026-12-02 03:52:36.3033+00', 0, 0, 'golden-a', '2026-12-02 03:57:36.3033+00', 'c460aef4930e6da9282fdd7d');
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('22222222-2222-4222-8222-222222222222', 'op-enqueued', 'POST', 'http://api.golden.example/v1/charges', '{"Content-Type": ["application/json"]}', '\x7b22646f223a22323031222c226f70223a226f702d656e717565756564227d', 'ecb38b97a247b77860a787e22f795a1d03e64d646ed37aadccc969edb3f0e519', 'pending', '2026-12-02 03:52:36.313276+00', '2026-12-02 03:52:36.313276+00', 0, 0, NULL, NULL, NULL);
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('33333333-3333-4333-8333-333333333333', 'op-enqueued-empty', 'POST', 'http://api.golden.example/v1/charges', '{"Content-Type": ["application/json"]}', '\x', 'b96d2f61afd210abd03e99f0026c076562358fba452966948622ca81417216a8', 'pending', '2026-12-02 03:52:36.317728+00', '2026-12-02 03:52:36.317728+00', 0, 0, NULL, NULL, NULL);
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('44444444-4444-4444-8444-444444444444', NULL, 'POST', 'http://api.golden.example/v1/charges', '{"Content-Type": ["application/json"]}', '\x7b22646f223a22323031222c226f70223a226e6f2d6f7065726174696f6e227d', '1e9d6344c4a31061e4b0a04258372b6ea0f961722ca8643e5e3910fa82bd02d4', 'pending', '2026-12-02 03:52:36.318754+00', '2026-12-02 03:52:36.318754+00', 0, 0, NULL, NULL, NULL);
INSERT INTO idemhttp_golden.idemhttp_journal VALUES ('55555555-5555-4555-8555-555555555555', 'op-abandoned', 'POST', 'http://api.golden.example/v1/charges', '{"Content-Type": ["application/json"]}', '\x7b22646f223a22323031222c226f70223a226f702d6162616e646f6e6564227d', '133824c53c5e44061df21c939655ebfec349f42ad7c7436a2bcf619515daad88', 'abandoned', '2026-12-02 03:52:36.321771+00', '2026-12-02 03:52:36.325089+00', 4, 503, NULL, NULL, NULL);


--
-- Name: idemhttp_journal idemhttp_journal_pkey; Type: CONSTRAINT; Schema: idemhttp_golden; Owner: -
--

ALTER TABLE ONLY idemhttp_golden.idemhttp_journal
    ADD CONSTRAINT idemhttp_journal_pkey PRIMARY KEY (key);


--
-- Name: idemhttp_journal_done; Type: INDEX; Schema: idemhttp_golden; Owner: -
--

CREATE INDEX idemhttp_journal_done ON idemhttp_golden.idemhttp_journal USING btree (updated_at) WHERE (state = 'done'::text);


--
-- Name: idemhttp_journal_operation; Type: INDEX; Schema: idemhttp_golden; Owner: -
--

CREATE UNIQUE INDEX idemhttp_journal_operation ON idemhttp_golden.idemhttp_journal USING btree (operation);


--
-- Name: idemhttp_journal_pending; Type: INDEX; Schema: idemhttp_golden; Owner: -
--

CREATE INDEX idemhttp_journal_pending ON idemhttp_golden.idemhttp_journal USING btree (created_at, key) WHERE (state = 'pending'::text);


--
-- PostgreSQL database dump complete
--


