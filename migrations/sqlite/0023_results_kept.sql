-- Where a finished task's results stand when they are not simply stored: 'uploading' (the
-- run ended while the server or storage was away; its node keeps them and uploads them) or
-- 'lost' (they could not be kept). NULL otherwise.
ALTER TABLE tasks ADD COLUMN results TEXT;
