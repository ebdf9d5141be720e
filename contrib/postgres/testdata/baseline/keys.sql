-- The idemhttp tables of the release at commit 2d053bb after the requests
-- of requests.tsv, dumped by pg_dump 15 (see gen.go); the schema's name is
-- __SCHEMA__. Never regenerate it: it is what that release left.
--
-- PostgreSQL database dump
--

\restrict rTHjvmcnkFVMobFrrb8jpoQBDyor2WE7BMLnjO9UVSDmBAvMM76YnfANrSIPZjA

-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

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

--
-- Name: __SCHEMA__; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA __SCHEMA__;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: idemhttp_inbox; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.idemhttp_inbox (
    consumer text NOT NULL,
    id text NOT NULL,
    processed_at bigint NOT NULL
);


--
-- Name: idemhttp_journal; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.idemhttp_journal (
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
-- Name: idemhttp_keys; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.idemhttp_keys (
    key bytea NOT NULL,
    token bytea NOT NULL,
    fingerprint bytea NOT NULL,
    record bytea,
    expires_at timestamp with time zone NOT NULL
);


--
-- Name: idemhttp_outbox; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.idemhttp_outbox (
    seq bigint NOT NULL,
    id text NOT NULL,
    topic text NOT NULL,
    key bytea,
    body bytea,
    header jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: idemhttp_outbox_seq_seq; Type: SEQUENCE; Schema: __SCHEMA__; Owner: -
--

CREATE SEQUENCE __SCHEMA__.idemhttp_outbox_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: idemhttp_outbox_seq_seq; Type: SEQUENCE OWNED BY; Schema: __SCHEMA__; Owner: -
--

ALTER SEQUENCE __SCHEMA__.idemhttp_outbox_seq_seq OWNED BY __SCHEMA__.idemhttp_outbox.seq;


--
-- Name: idemhttp_recovery; Type: TABLE; Schema: __SCHEMA__; Owner: -
--

CREATE TABLE __SCHEMA__.idemhttp_recovery (
    key bytea NOT NULL,
    step text NOT NULL,
    data bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: idemhttp_outbox seq; Type: DEFAULT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.idemhttp_outbox ALTER COLUMN seq SET DEFAULT nextval('__SCHEMA__.idemhttp_outbox_seq_seq'::regclass);


--
-- Data for Name: idemhttp_inbox; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--



--
-- Data for Name: idemhttp_journal; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--



--
-- Data for Name: idemhttp_keys; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--

INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a732d6a736f6e', '\x353236636264616334363838383965332d31', '\x62356633616236616364383031623664376330326166376238636562666166653762346265343137316433616332663561613566373837383966393136636639', '\x01c901020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010463685f317b226964223a2263685f31227d', '2026-12-03 05:15:59.081032+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f323a732d6a736f6e', '\x353236636264616334363838383965332d32', '\x62356633616236616364383031623664376330326166376238636562666166653762346265343137316433616332663561613566373837383966393136636639', '\x01c901020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010463685f327b226964223a2263685f32227d', '2026-12-03 05:15:59.094659+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a732d666f726d', '\x353236636264616334363838383965332d33', '\x32323630356437393837386236613334656535303438353036393861623836653034656363666462646334396466313631303633383362336330383061333139', '\x01c901020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010463685f337b226964223a2263685f33227d', '2026-12-03 05:15:59.117643+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a732d74657874', '\x353236636264616334363838383965332d34', '\x64353935323137393630646664383963646235313064383836326162313138626666376134656662396430353662613732313036636438386266353064363565', '\x01c901020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010463685f347b226964223a2263685f34227d', '2026-12-03 05:15:59.128731+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a732d6d756c746970617274', '\x353236636264616334363838383965332d35', '\x66346538616666653133363164363331376466353465303466383833383039623237633763303262643637663366663234396236663761316636383164346232', '\x01c901020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010463685f357b226964223a2263685f35227d', '2026-12-03 05:15:59.143736+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a732d347878', '\x353236636264616334363838383965332d36', '\x30346561663735313638303136653737383163613430383861376633626439313666353539386161333436636366346539393766653733333732323831656639', '\x019003020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010463685f367b226572726f72223a22616d6f756e74227d', '2026-12-03 05:15:59.159406+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a732d626967', '\x353236636264616334363838383965332d37', '\x30636234613132343661336364613365623833643130346134656662316532326366313261323463366461633134316561653538616239663665376236643239', '\x02c901', '2026-12-03 05:15:59.167914+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a742d6a736f6e', '\x74782d396465646465333865386565613638622d31', '\x66653935396136623637656230656537373264613531623638613833323332356464656164303834316231303865313463316436393533373435646661653539', '\x01c901020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010463685f387b226964223a2263685f38227d', '2026-12-03 05:15:59.17093+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a742d666f726d', '\x74782d396465646465333865386565613638622d32', '\x39303161343531656431613064613364306165396466313863633865373538343830383166333835666431646239363436623762643635306363366439393164', '\x01c901020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010463685f397b226964223a2263685f39227d', '2026-12-03 05:15:59.176096+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a742d347878', '\x74782d396465646465333865386565613638622d33', '\x30346561663735313638303136653737383163613430383861376633626439313666353539386161333436636366346539393766653733333732323831656639', '\x019003020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010563685f31307b226572726f72223a22616d6f756e74227d', '2026-12-03 05:15:59.187306+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x7368613235363a37646464633464353561353834363231323063346464613034303636333036633039346462303135616133363763326665336538353366343834323966333666', '\x74782d396465646465333865386565613638622d34', '\x34353535623361373238326664353566333165633533613734343965653665653631316265386237623931343630376464646137333661396636653966643338', '\x01c901020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e08582d436861726765010563685f31317b226964223a2263685f3131227d', '2026-12-03 05:15:59.195232+00');
INSERT INTO __SCHEMA__.idemhttp_keys VALUES ('\x363a616363745f313a732d636c61696d', '\x676f6c642d636c61696d', '\x33316632653637653865386534386661363131646436633962646637653931366665303765323838643030616633646362613262636162306236353439343432', NULL, '2026-12-03 05:15:59.199331+00');


--
-- Data for Name: idemhttp_outbox; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--



--
-- Data for Name: idemhttp_recovery; Type: TABLE DATA; Schema: __SCHEMA__; Owner: -
--



--
-- Name: idemhttp_outbox_seq_seq; Type: SEQUENCE SET; Schema: __SCHEMA__; Owner: -
--

SELECT pg_catalog.setval('__SCHEMA__.idemhttp_outbox_seq_seq', 1, false);


--
-- Name: idemhttp_inbox idemhttp_inbox_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.idemhttp_inbox
    ADD CONSTRAINT idemhttp_inbox_pkey PRIMARY KEY (consumer, id);


--
-- Name: idemhttp_journal idemhttp_journal_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.idemhttp_journal
    ADD CONSTRAINT idemhttp_journal_pkey PRIMARY KEY (key);


--
-- Name: idemhttp_keys idemhttp_keys_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.idemhttp_keys
    ADD CONSTRAINT idemhttp_keys_pkey PRIMARY KEY (key);


--
-- Name: idemhttp_outbox idemhttp_outbox_id_key; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.idemhttp_outbox
    ADD CONSTRAINT idemhttp_outbox_id_key UNIQUE (id);


--
-- Name: idemhttp_outbox idemhttp_outbox_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.idemhttp_outbox
    ADD CONSTRAINT idemhttp_outbox_pkey PRIMARY KEY (seq);


--
-- Name: idemhttp_recovery idemhttp_recovery_pkey; Type: CONSTRAINT; Schema: __SCHEMA__; Owner: -
--

ALTER TABLE ONLY __SCHEMA__.idemhttp_recovery
    ADD CONSTRAINT idemhttp_recovery_pkey PRIMARY KEY (key, step);


--
-- Name: idemhttp_inbox_processed_at; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX idemhttp_inbox_processed_at ON __SCHEMA__.idemhttp_inbox USING brin (processed_at);


--
-- Name: idemhttp_journal_done; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX idemhttp_journal_done ON __SCHEMA__.idemhttp_journal USING btree (updated_at) WHERE (state = 'done'::text);


--
-- Name: idemhttp_journal_operation; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE UNIQUE INDEX idemhttp_journal_operation ON __SCHEMA__.idemhttp_journal USING btree (operation);


--
-- Name: idemhttp_journal_pending; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX idemhttp_journal_pending ON __SCHEMA__.idemhttp_journal USING btree (created_at, key) WHERE (state = 'pending'::text);


--
-- Name: idemhttp_keys_expires_at; Type: INDEX; Schema: __SCHEMA__; Owner: -
--

CREATE INDEX idemhttp_keys_expires_at ON __SCHEMA__.idemhttp_keys USING btree (expires_at);


--
-- PostgreSQL database dump complete
--

\unrestrict rTHjvmcnkFVMobFrrb8jpoQBDyor2WE7BMLnjO9UVSDmBAvMM76YnfANrSIPZjA

