"""MQTT topic filters checked as the protocol says, before anything connects.

A broker refuses an invalid filter only when the SUBSCRIBE reaches it (or, as
mosquitto 2.0 does, by closing the connection), long after a job started: so
:class:`~spark_receivers.receivers.mqtt.MqttReceiver` checks its filter when it
is made, on the driver, and the command line before Spark starts.

The rules (MQTT 3.1.1 and 5, section 4.7):

* a filter is not empty, and at most 65,535 bytes of UTF-8 without U+0000;
* ``#`` (every level below) is the whole of the last level: ``logs/#`` or ``#``,
  never ``logs/#/x`` nor ``logs#``;
* ``+`` (one level) is a whole level: ``sensors/+/temp``, never ``sensors/a+``;
* a shared subscription ``$share/<group>/<filter>`` has a group name without
  ``/``, ``+`` or ``#`` and a filter that follows the rules above.

Plain functions, no state.
"""

from __future__ import annotations

from spark_receivers.errors import ConfigError

__all__ = ["check_topic_filter"]

MAX_TOPIC_BYTES = 65_535
SHARE_PREFIX = "$share/"


def check_topic_filter(topic: str) -> None:
    """Raise :class:`ConfigError` naming ``topic`` and the rule it breaks (see the module doc)."""
    problem = _problem(topic)
    if problem is not None:
        msg = f"invalid MQTT topic filter {topic!r}: {problem}"
        raise ConfigError(msg)


def _problem(topic: str) -> str | None:
    if not isinstance(topic, str) or not topic:
        return "a topic filter must be a non-empty string"
    if "\x00" in topic:
        return "it contains the character U+0000"
    if len(topic.encode("utf-8", "surrogatepass")) > MAX_TOPIC_BYTES:
        return f"it is longer than {MAX_TOPIC_BYTES:,} bytes of UTF-8"
    levels = topic.split("/")
    if topic.startswith(SHARE_PREFIX):
        group = levels[1]
        if not group or "+" in group or "#" in group:
            return (
                "a shared subscription is $share/<group>/<filter> with a non-empty group "
                f"name without '+' or '#', got group {group!r}"
            )
        if len(levels) < 3 or not "/".join(levels[2:]):
            return "a shared subscription $share/<group>/<filter> needs a filter after the group"
        levels = levels[2:]
    for i, level in enumerate(levels):
        if "#" in level and level != "#":
            return f"'#' must stand alone in its level (logs/# or #), got level {level!r}"
        if level == "#" and i != len(levels) - 1:
            return (
                f"'#' must be the last level (logs/# or #), got it at level {i + 1} "
                f"of {len(levels)}"
            )
        if "+" in level and level != "+":
            return f"'+' must stand alone in a level (sensors/+/temp), got level {level!r}"
    return None
