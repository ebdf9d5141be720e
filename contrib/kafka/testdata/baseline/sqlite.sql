PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE idemhttp_kafka_offsets (
    consumer    text    NOT NULL, -- the consumer group
    topic       text    NOT NULL,
    part        integer NOT NULL, -- the partition
    next_offset bigint  NOT NULL, -- the offset of the first record not yet processed
    PRIMARY KEY (consumer, topic, part)
);
INSERT INTO idemhttp_kafka_offsets VALUES('billing','orders',0,5);
INSERT INTO idemhttp_kafka_offsets VALUES('billing','orders',1,3);
INSERT INTO idemhttp_kafka_offsets VALUES('billing','refunds',0,2);
COMMIT;
