-- 0013: each registered process says which bus it uses (its Redis location and key prefix,
-- credentials left out), so a gateway and workers of one app that do not share a bus are
-- told at start: a gateway on another key prefix accepted messages (202) that no worker
-- would ever read (operator probe). Rows of older processes read '' (not compared).
ALTER TABLE app_processes ADD COLUMN bus text NOT NULL DEFAULT '';
