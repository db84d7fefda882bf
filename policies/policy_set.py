"""The policies a plugin serves with: every file of a policy directory, by ``metadata.name``,
and the rule that picks one per advertised resource."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cdigen.errors import InputError

if TYPE_CHECKING:
    from cdigen.policies.policy import Policy

POLICY_SUFFIXES = (".yaml", ".yml", ".json")


class PolicyRequest(Protocol):
    """What a resource asks of the policy set: its name and, optionally, a policy by name."""

    @property
    def name(self) -> str:
        """The advertised resource name, e.g. ``nvidia.com/gpu``."""
        ...

    @property
    def policy(self) -> str | None:
        """The policy named in the plugin config, or None."""
        ...


@dataclass(frozen=True)
class PolicySet:
    """The policies loaded from the policy directory, by ``metadata.name``."""

    by_name: Mapping[str, Policy] = field(default_factory=dict)
    files: Mapping[str, Path] = field(default_factory=dict)

    def for_resource(self, resource: PolicyRequest, default: str = "default") -> Policy:
        """The policy ``resource`` asks for: by name (dir, then built-in), else one for its
        resource name in the dir, else the built-in ``default``."""
        from cdigen.policies.policy import BUILTIN_NAMES, builtin_policy, builtin_policy_name

        if resource.policy:
            if resource.policy in self.by_name:
                return self.by_name[resource.policy]
            builtin = builtin_policy_name(resource.policy)
            if builtin is None:
                known = sorted(self.by_name) + list(BUILTIN_NAMES)
                raise InputError(
                    f"no policy named {resource.policy!r} for {resource.name}",
                    where="resources[].policy",
                    hint=f"name a policy in the policy dir or a built-in: {', '.join(known)}",
                )
            return builtin_policy(builtin)
        for policy in self.by_name.values():
            if policy.resource == resource.name:
                return policy
        return builtin_policy(default)


def load_policy_set(policy_dir: Path | None) -> PolicySet:
    """Load every policy file in ``policy_dir``; the first bad file raises (nothing half-loaded)."""
    from cdigen.policies.policy import load_policy

    by_name: dict[str, Policy] = {}
    files: dict[str, Path] = {}
    if policy_dir is None:
        return PolicySet(by_name, files)
    if not policy_dir.is_dir():
        raise InputError(
            "policy directory not found", where=str(policy_dir), hint="check --policy-dir"
        )
    for path in sorted(policy_dir.iterdir()):
        if path.suffix not in POLICY_SUFFIXES or path.name.startswith("."):
            continue
        policy = load_policy(path)
        name = policy.name or path.stem
        if name in by_name:
            raise InputError(
                f"policy name {name!r} is also used by {files[name].name}",
                where=str(path),
                hint="give each policy its own metadata.name",
            )
        by_name[name] = policy
        files[name] = path
    return PolicySet(by_name, files)
