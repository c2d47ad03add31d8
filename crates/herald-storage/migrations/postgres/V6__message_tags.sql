-- Version 6: message tags (Centrifugo's publication `tags`).
--
-- `tags` is the JSON object text of a message's tags (string keys to
-- string values, keys in byte order, no whitespace), NULL for a message
-- without tags (every message stored before this version). `text`, not
-- `jsonb`, like `data`: the stored text is the one delivered. Adding a
-- nullable column without a default changes only the catalog
-- (PostgreSQL documentation, ALTER TABLE): no row is rewritten.
ALTER TABLE messages ADD COLUMN tags text;
