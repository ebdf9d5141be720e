#!/bin/sh
# Remakes testdata/journal-2d053bb.sql: run from contrib/postgres of a worktree of
# commit 2d053bb, with IDEMHTTP_POSTGRES_URL set (.ci/services.sh). The
# dump names the schema idemhttp_golden; the test loads it into one of its
# own. psql's \restrict lines (random per dump) are left out.
set -eu
schema=$(go run testdata/golden/main.go)
pg_dump --dbname="$IDEMHTTP_POSTGRES_URL" --no-owner --no-privileges --inserts \
	--schema="$schema" --table="$schema.idemhttp_journal" |
	sed -e "s/$schema/idemhttp_golden/g" -e '/^-- Dumped/d' -e '/^\\restrict /d' -e '/^\\unrestrict /d' \
	> testdata/journal-2d053bb.sql
psql "$IDEMHTTP_POSTGRES_URL" -qc "DROP SCHEMA $schema CASCADE" 2>/dev/null
