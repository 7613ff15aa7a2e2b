"""Operations around a run: the environment check, Ray fleets, the empirical audit."""
