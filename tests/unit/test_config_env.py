"""Options from BROKERD_* environment variables: command line > environment > TOML > default."""

from __future__ import annotations

import pytest

from brokerd.cluster.config import OPTIONS, ConfigError, env_name, load

DEFAULTS = {o.name: o.default for o in OPTIONS}


def test_every_option_has_a_variable():
    assert env_name("workers") == "BROKERD_WORKERS"
    assert env_name("max_queued") == "BROKERD_MAX_QUEUED"
    assert len({env_name(o.name) for o in OPTIONS}) == len(OPTIONS)


def test_values_of_each_kind_come_from_the_environment():
    cfg = load([], {
        "BROKERD_WORKERS": "3", "BROKERD_LISTEN": "127.0.0.1:1999", "BROKERD_LOG": "off",
        "BROKERD_FSYNC": "always", "BROKERD_SEGMENT_BYTES": "8M", "BROKERD_MESH_TIMEOUT": "1.5",
        "BROKERD_MESH": "127.0.0.1:7100", "BROKERD_MESH_KEY": "k.key_secret", "BROKERD_AGREEMENT": "off",
        "BROKERD_PEER": "127.0.0.2:7100, 127.0.0.3:7100,", "BROKERD_NODE_ID": "env-node",
        "BROKERD_LOG_LEVEL": "debug",
    })
    assert cfg.workers == 3 and cfg.listen == ("127.0.0.1", 1999) and cfg.log is False
    assert cfg.fsync == "always" and cfg.segment_bytes == 8 << 20 and cfg.mesh_timeout == 1.5
    assert cfg.mesh == ("127.0.0.1", 7100) and cfg.mesh_key == "k.key_secret" and cfg.agreement_off
    assert cfg.peer == (("127.0.0.2", 7100), ("127.0.0.3", 7100))
    assert cfg.node_id == "env-node" and cfg.log_level == "debug"


def test_unset_empty_and_unrelated_variables_leave_the_defaults():
    cfg = load([], {"BROKERD_WORKERS": "", "BROKERD_RUN_DIR": "/tmp/x", "BROKERD_BENCH_ARGS": "--log on",
                    "WORKERS": "7"})
    assert cfg.workers == DEFAULTS["workers"] and cfg.log is True and cfg.listen == ("127.0.0.1", 1883)


def test_command_line_beats_environment_beats_toml_beats_default(tmp_path):
    toml = tmp_path / "b.toml"
    toml.write_text('workers = 2\nmax_queued = 10\nmax_inflight = 5\nfsync = "never"\n')
    env = {"BROKERD_WORKERS": "3", "BROKERD_MAX_QUEUED": "20"}
    cfg = load(["--config", str(toml), "--workers", "4"], env)
    assert cfg.workers == 4  # command line over environment and TOML
    assert cfg.max_queued == 20  # environment over TOML
    assert cfg.max_inflight == 5 and cfg.fsync == "never"  # TOML over default
    assert cfg.max_connections == DEFAULTS["max_connections"]  # default


def test_config_file_from_the_environment(tmp_path):
    toml = tmp_path / "b.toml"
    toml.write_text("max_queued = 10\n")
    other = tmp_path / "c.toml"
    other.write_text("max_queued = 11\n")
    assert load([], {"BROKERD_CONFIG": str(toml)}).max_queued == 10
    assert load(["--config", str(other)], {"BROKERD_CONFIG": str(toml)}).max_queued == 11
    with pytest.raises(ConfigError, match=r"^BROKERD_CONFIG: cannot read .*nope\.toml"):
        load([], {"BROKERD_CONFIG": str(tmp_path / "nope.toml")})


def test_port_variable_is_short_for_listen_and_listen_wins(tmp_path):
    """--port, BROKERD_PORT and TOML's port mean loopback (the quick start's anonymous clients get in);
    the network needs an explicit --listen."""
    assert load([], {"BROKERD_PORT": "1999"}).listen == ("127.0.0.1", 1999)
    assert load([], {"BROKERD_PORT": "1999", "BROKERD_LISTEN": "0.0.0.0:2000"}).listen == ("0.0.0.0", 2000)
    by_flag = load(["--port", "2001"], {"BROKERD_LISTEN": "0.0.0.0:2000"})
    assert by_flag.listen == ("127.0.0.1", 2001) and by_flag.listeners[0].allow_anonymous
    toml = tmp_path / "b.toml"
    toml.write_text('listen = "0.0.0.0:2002"\n')
    assert load(["--config", str(toml)], {"BROKERD_PORT": "1999"}).listen == ("127.0.0.1", 1999)
    toml.write_text('port = 2003\n')
    assert load(["--config", str(toml)], {}).listen == ("127.0.0.1", 2003)


@pytest.mark.parametrize(("env", "named"), [
    ({"BROKERD_WORKERS": "0"}, "BROKERD_WORKERS: must be at least 1, got '0'"),
    ({"BROKERD_WORKERS": "many"}, "BROKERD_WORKERS: invalid value 'many'"),
    ({"BROKERD_FSYNC": "sometimes"}, "BROKERD_FSYNC: invalid value 'sometimes' (choose from always, interval, never)"),
    ({"BROKERD_LOG": "maybe"}, "BROKERD_LOG: invalid value 'maybe' (expected on or off)"),
    ({"BROKERD_LISTEN": "nowhere"}, "BROKERD_LISTEN: invalid value 'nowhere' (expected HOST:PORT"),
    ({"BROKERD_MESH": "127.0.0.1:7000", "BROKERD_PEER": "b:7000,c:0"}, "BROKERD_PEER: must be a port number"),
    ({"BROKERD_PORT": "x"}, "BROKERD_PORT: expected a port number, got 'x'"),
    ({"BROKERD_PORT": "70000"}, "BROKERD_PORT: must be a port number (1-65535), got '70000'"),
    ({"BROKERD_SEGMENT_BYTES": "1K"}, "BROKERD_SEGMENT_BYTES: must be at least 4096"),
])
def test_a_bad_value_is_one_line_naming_the_variable(env, named):
    with pytest.raises(ConfigError) as err:
        load([], env)
    message = str(err.value)
    assert message.startswith(named) and "\n" not in message


def test_a_bad_variable_stops_start_up_even_where_a_flag_replaces_it():
    # The environment is checked as a whole, like a TOML file: a bad value stops start-up even if
    # a flag would replace it, so a typo in a unit file does not lie dormant.
    with pytest.raises(ConfigError, match="BROKERD_WORKERS"):
        load(["--workers", "2"], {"BROKERD_WORKERS": "0"})


def test_rules_between_options_see_environment_values():
    with pytest.raises(ConfigError, match="--peer: needs --mesh"):
        load([], {"BROKERD_PEER": "b:7000"})
    with pytest.raises(ConfigError, match="--stats-port: port 1883 is also used by --listen"):
        load([], {"BROKERD_STATS_PORT": "1883", "BROKERD_WORKERS": "1"})
