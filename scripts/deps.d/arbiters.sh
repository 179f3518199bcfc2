#!/usr/bin/env bash
# The arbiter battery (tests/arbiter_battery.rs) expects, on this host:
#   PostgreSQL on 127.0.0.1:5432, role root (trust), database test;
#   MariaDB on 127.0.0.1:3306, user root with no password, database test.
# Does nothing when that is already so; otherwise starts the services and creates what is missing.
set -euo pipefail
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    pg_ctlcluster 15 main start 2>/dev/null || service postgresql start
    for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
fi
if ! psql -h 127.0.0.1 -U root -d test -Atc 'select 1' >/dev/null 2>&1; then
    runuser -u postgres -- psql -Atc "select 1 from pg_roles where rolname = 'root'" | grep -q 1 \
        || runuser -u postgres -- createuser --superuser root
    runuser -u postgres -- psql -Atc "select 1 from pg_database where datname = 'test'" | grep -q 1 \
        || runuser -u postgres -- createdb -O root test
    if ! psql -h 127.0.0.1 -U root -d test -Atc 'select 1' >/dev/null 2>&1; then
        echo "PostgreSQL: allow trust for root on 127.0.0.1 (pg_hba.conf: host all all 127.0.0.1/32 trust)" >&2
        exit 1
    fi
fi
if ! mariadb -h 127.0.0.1 -P 3306 -uroot -e 'select 1' test >/dev/null 2>&1; then
    pgrep -x mariadbd >/dev/null || service mariadb start || service mysql start
    for _ in $(seq 50); do mariadb -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
    mariadb -uroot -e "CREATE DATABASE IF NOT EXISTS test; ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD(''); FLUSH PRIVILEGES;"
fi
