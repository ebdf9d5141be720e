CREATE TABLE idemhttp_inbox (
    consumer text NOT NULL,
    id text NOT NULL,
    processed_at bigint NOT NULL
);

INSERT INTO idemhttp_inbox VALUES ('billing', 'order-1', 1796185036819368);
INSERT INTO idemhttp_inbox VALUES ('billing', 'order-2', 1796185036849406);
INSERT INTO idemhttp_inbox VALUES ('billing', 'sha256:c4eb1720cdfbb081856526d263c8a6224d3a02f73ab803549748677b5c972159', 1796185036851984);
INSERT INTO idemhttp_inbox VALUES ('billing', 'sha256:48db0189ae6e27048bc8d1e872fe55b57a6d51df232ecddc03c1b0175ff7f74c', 1796185036856355);
INSERT INTO idemhttp_inbox VALUES ('billing', 'batch-1', 1796185036875216);
INSERT INTO idemhttp_inbox VALUES ('billing', 'batch-2', 1796185036875216);
INSERT INTO idemhttp_inbox VALUES ('billing', 'batch-3', 1796185036875216);
INSERT INTO idemhttp_inbox VALUES ('mailer', 'order-1', 1796185036882595);
INSERT INTO idemhttp_inbox VALUES ('mailer', 'mail-7', 1796185036895598);

ALTER TABLE ONLY idemhttp_inbox
    ADD CONSTRAINT idemhttp_inbox_pkey PRIMARY KEY (consumer, id);

CREATE INDEX idemhttp_inbox_processed_at ON idemhttp_inbox USING btree (processed_at);
