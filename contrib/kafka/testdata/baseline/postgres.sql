CREATE TABLE idemhttp_kafka_offsets (
    consumer text NOT NULL,
    topic text NOT NULL,
    part integer NOT NULL,
    next_offset bigint NOT NULL
);

INSERT INTO idemhttp_kafka_offsets VALUES ('billing', 'orders', 0, 5);
INSERT INTO idemhttp_kafka_offsets VALUES ('billing', 'orders', 1, 3);
INSERT INTO idemhttp_kafka_offsets VALUES ('billing', 'refunds', 0, 2);

ALTER TABLE ONLY idemhttp_kafka_offsets
    ADD CONSTRAINT idemhttp_kafka_offsets_pkey PRIMARY KEY (consumer, topic, part);
