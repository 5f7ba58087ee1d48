"""The kopf operator: reconciles InferencePool and TenantSLA into pods, tables and autoscaling."""
