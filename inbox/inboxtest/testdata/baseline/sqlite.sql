PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE idemhttp_inbox (
    consumer     text   NOT NULL, -- the consumer (group) that processed the message
    id           text   NOT NULL, -- the message id, as StoredID gives it
    processed_at bigint NOT NULL, -- Unix microseconds, for Prune
    PRIMARY KEY (consumer, id)
);
INSERT INTO idemhttp_inbox VALUES('billing','order-1',1796185036633381);
INSERT INTO idemhttp_inbox VALUES('billing','order-2',1796185036634527);
INSERT INTO idemhttp_inbox VALUES('billing','sha256:c4eb1720cdfbb081856526d263c8a6224d3a02f73ab803549748677b5c972159',1796185036635273);
INSERT INTO idemhttp_inbox VALUES('billing','sha256:48db0189ae6e27048bc8d1e872fe55b57a6d51df232ecddc03c1b0175ff7f74c',1796185036636051);
INSERT INTO idemhttp_inbox VALUES('billing','batch-1',1796185036636711);
INSERT INTO idemhttp_inbox VALUES('billing','batch-2',1796185036636711);
INSERT INTO idemhttp_inbox VALUES('billing','batch-3',1796185036636711);
INSERT INTO idemhttp_inbox VALUES('mailer','order-1',1796185036637698);
INSERT INTO idemhttp_inbox VALUES('mailer','mail-7',1796185036643176);
CREATE INDEX idemhttp_inbox_processed_at ON idemhttp_inbox (processed_at);
COMMIT;
