-- haia_server: the role the replicas of compose.postgres.yaml run as. It owns
-- nothing; `store migrate --grant haia_server`, run by store-migrate as the
-- tables' owner, gives it what a server needs and no more (docs/store.md,
-- "Roles: the server owns nothing").
--
-- The postgres image runs this file once, when it initialises an empty data
-- directory, with psql -v ON_ERROR_STOP=1 as POSTGRES_USER. The password is
-- read from the secret file by psql itself: it is in no environment variable
-- and on no command line.

-- The statements below carry the password: neither they nor an error
-- about them goes to the server's log.
SET log_statement = 'none';
SET log_min_error_statement = 'panic';

\set haia_server_password `cat /run/secrets/haia-server-password`
SELECT length(:'haia_server_password') >= 16 AS haia_server_password_ok \gset
\if :haia_server_password_ok
CREATE ROLE haia_server LOGIN PASSWORD :'haia_server_password';
\else
DO $$ BEGIN RAISE EXCEPTION 'the secret haia-server-password (secrets/haia-server.password) holds fewer than 16 characters: put the password of haia_server there (openssl rand -hex 32), remove the postgres-data volume and start again'; END $$;
\endif
\unset haia_server_password
