-- Version 6: message tags (Centrifugo's publication `tags`).
--
-- `tags` is the JSON object text of a message's tags (string keys to
-- string values, keys in byte order, no whitespace), NULL for a message
-- without tags (every message stored before this version). Adding a
-- nullable column without a default rewrites no row.
ALTER TABLE messages ADD COLUMN tags TEXT;
