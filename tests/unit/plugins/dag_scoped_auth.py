"""An auth manager for the plugin's permission tests: Airflow's SimpleAuthManager, scoped per DAG.

SimpleAuthManager decides by role alone (every viewer reads every DAG), so it cannot show that
the page asks about each DAG. This one keeps its logins, roles and tokens and adds, for the users
named in ``ABP_TEST_DAG_SCOPES`` (a JSON object of user name to DAG ids), a per-DAG answer the
way FAB or Keycloak give one: such a user may reach only those DAGs, and nothing asked without
a DAG id.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


class DagScopedSimpleAuthManager(SimpleAuthManager):
    """SimpleAuthManager with per-user DAG scopes from ``ABP_TEST_DAG_SCOPES``."""

    def is_authorized_dag(
        self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None
    ) -> bool:
        """Refuse a scoped user any DAG outside their scope, then ask SimpleAuthManager."""
        scopes: dict[str, list[str]] = json.loads(os.environ.get("ABP_TEST_DAG_SCOPES", "{}"))
        scope = scopes.get(user.get_name())
        if scope is not None and (details is None or details.id not in scope):
            return False
        return bool(
            super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
        )
