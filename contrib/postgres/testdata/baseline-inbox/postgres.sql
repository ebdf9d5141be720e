CREATE TABLE idemhttp_inbox (
    consumer text NOT NULL,
    id text NOT NULL,
    processed_at bigint NOT NULL
);

CREATE TABLE idemhttp_outbox (
    seq bigint NOT NULL,
    id text NOT NULL,
    topic text NOT NULL,
    key bytea,
    body bytea,
    header jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE SEQUENCE idemhttp_outbox_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE idemhttp_outbox_seq_seq OWNED BY idemhttp_outbox.seq;

ALTER TABLE ONLY idemhttp_outbox ALTER COLUMN seq SET DEFAULT nextval('idemhttp_outbox_seq_seq'::regclass);

INSERT INTO idemhttp_inbox VALUES ('billing', 'order-1', 1796185037045735);
INSERT INTO idemhttp_inbox VALUES ('billing', 'order-2', 1796185037047976);
INSERT INTO idemhttp_inbox VALUES ('billing', 'sha256:c4eb1720cdfbb081856526d263c8a6224d3a02f73ab803549748677b5c972159', 1796185037048719);
INSERT INTO idemhttp_inbox VALUES ('billing', 'batch-1', 1796185037054043);
INSERT INTO idemhttp_inbox VALUES ('billing', 'batch-2', 1796185037054043);
INSERT INTO idemhttp_inbox VALUES ('mailer', 'order-1', 1796185037057439);

INSERT INTO idemhttp_outbox VALUES (1, 'out-0', 'orders', '\x6b', '\x626f64792030', '{"trace": ["t-1"]}', '2026-12-02 04:17:17.061411+00');
INSERT INTO idemhttp_outbox VALUES (2, 'out-1', 'orders', '\x6b', '\x626f64792031', '{"trace": ["t-1"]}', '2026-12-02 04:17:17.063137+00');

SELECT pg_catalog.setval('idemhttp_outbox_seq_seq', 2, true);

ALTER TABLE ONLY idemhttp_inbox
    ADD CONSTRAINT idemhttp_inbox_pkey PRIMARY KEY (consumer, id);

ALTER TABLE ONLY idemhttp_outbox
    ADD CONSTRAINT idemhttp_outbox_id_key UNIQUE (id);

ALTER TABLE ONLY idemhttp_outbox
    ADD CONSTRAINT idemhttp_outbox_pkey PRIMARY KEY (seq);

CREATE INDEX idemhttp_inbox_processed_at ON idemhttp_inbox USING brin (processed_at);
