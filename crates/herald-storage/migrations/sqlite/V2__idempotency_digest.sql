-- Herald's SQLite schema, version 2: the digest of the message stored with
-- its idempotency key (SHA-256 of the channel name, a zero byte and the
-- data's exact text; `herald_storage::idempotency_digest`). A message
-- published again with the same key on the same channel but a different
-- digest is refused (`idempotency_key_reused`). NULL for messages without
-- a key, and for keys stored before this version: those keep answering
-- with the original message, whatever is published with them.
ALTER TABLE messages ADD COLUMN idempotency_digest BLOB;
