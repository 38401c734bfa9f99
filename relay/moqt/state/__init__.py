"""The session rules, sans-IO."""
